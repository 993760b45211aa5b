//! Options shared by the commands that run the model.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use kazeia_engine::codec::DecoderPrecision;
use kazeia_engine::lm::LmBackends;
use kazeia_engine::plugins::{backend_named, discover_for, search_path};
use kazeia_engine::weights_auto::{AutoMachine, WeightsSetting};
use kazeia_engine::Backend;

#[derive(Args)]
pub struct SamplingArgs {
    /// Greedy decoding for the talker and the code predictor (instead of sampling).
    #[arg(long)]
    pub greedy: bool,
    /// Seed of the sampler (reproducible sampling).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Codebook-0 tokens to sample at most (official meaning: at most N − 1 frames come out; per text chunk
    /// for synth). Default: generation_config.json's, and for synth a limit from each chunk's length (about a
    /// second per text token: a generation the model never ends stops there).
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Text placement in the prompt; default: the official wrapper's default for the model type.
    #[arg(long)]
    pub non_streaming_mode: Option<bool>,
}

#[derive(Args)]
pub struct EngineArgs {
    /// Storage of the talker's and code predictor's weights: bf16 (the released models' own, lossless), q8_0
    /// or q4_0 (smaller and faster, slightly lossy), f16, f32, or auto: the most precise that this machine runs
    /// comfortably faster than real time (as the daemon's default; measured once, then cached). Default: auto
    /// (for `synth`, kazeia.toml's `[model] weights`).
    #[arg(long)]
    pub weights: Option<WeightsSetting>,
    /// Worker threads for the CPU backend.
    #[arg(long, default_value_t = crate::default_threads())]
    pub threads: usize,
    #[command(flatten)]
    pub backends: BackendArgs,
}

impl EngineArgs {
    /// `--weights`, else auto.
    pub fn weights(&self) -> WeightsSetting {
        self.weights.unwrap_or(WeightsSetting::Auto)
    }

    /// What `auto`'s measurement is keyed by: every stage runs with `--threads`.
    pub fn machine(&self) -> AutoMachine {
        AutoMachine::new([self.threads; 3])
    }
}

/// Which backend runs each stage.
#[derive(Args)]
pub struct BackendArgs {
    /// Backend of every stage (`cpu`, or a plugin's name such as `vulkan`); unavailable → cpu, with a warning.
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Backend of the talker (default: --backend).
    #[arg(long)]
    pub talker_backend: Option<String>,
    /// Backend of the code predictor (default: --backend).
    #[arg(long)]
    pub cp_backend: Option<String>,
    /// Backend of the codec decoder (default: --backend).
    #[arg(long)]
    pub decoder_backend: Option<String>,
    /// Extra directory searched for backend plugins (repeatable; also KAZEIA_PLUGIN_PATH).
    #[arg(long)]
    pub plugin_path: Vec<PathBuf>,
}

/// The codec decoder's precision.
#[derive(Args)]
pub struct DecoderArgs {
    /// The codec decoder's precision: exact, or fast (its convolutions faster and not exact: within 40 dB SNR
    /// of the exact decoder; the CPU backend only). Default: exact (for `synth`, kazeia.toml's `[stream] decoder`).
    #[arg(long = "decoder", value_name = "exact|fast")]
    pub precision: Option<DecoderPrecision>,
}

impl BackendArgs {
    /// The LM stages' backends and the decoder's, logging every fallback to the CPU.
    pub fn resolve(&self, threads: usize) -> (LmBackends, Arc<dyn Backend>) {
        self.resolve_with(threads, DecoderPrecision::Exact)
    }

    /// [`BackendArgs::resolve`] with the decoder's convolutions computed as `precision` says: a fast decoder on
    /// the CPU backend is a built-in CPU backend of its own (the LM stages keep theirs); on a plugin the fast mode
    /// does not apply (a warning says so).
    pub fn resolve_with(
        &self,
        threads: usize,
        precision: DecoderPrecision,
    ) -> (LmBackends, Arc<dyn Backend>) {
        let (lm, decoder) = self.resolve_exact(threads);
        if precision == DecoderPrecision::Exact {
            return (lm, decoder);
        }
        if self.decoder_backend.as_deref().unwrap_or(&self.backend) != "cpu" {
            tracing::warn!(
                "--decoder {precision} applies to the cpu backend only; the decoder's backend is {}",
                decoder.name()
            );
            return (lm, decoder);
        }
        tracing::info!(
            "decoder {precision}: convolutions on {}",
            precision.kernel()
        );
        (lm, Arc::new(precision.cpu_backend(threads)))
    }

    fn resolve_exact(&self, threads: usize) -> (LmBackends, Arc<dyn Backend>) {
        let names = [
            self.talker_backend.as_deref().unwrap_or(&self.backend),
            self.cp_backend.as_deref().unwrap_or(&self.backend),
            self.decoder_backend.as_deref().unwrap_or(&self.backend),
        ];
        let plugins = discover_for(&search_path(&self.plugin_path), &names);
        let mut chosen: Vec<(String, Arc<dyn Backend>)> = Vec::new();
        let mut pick = |name: &str| -> Arc<dyn Backend> {
            if let Some((_, b)) = chosen.iter().find(|(n, _)| n == name) {
                return b.clone();
            }
            let (backend, warning) = backend_named(name, threads, &plugins);
            if let Some(w) = warning {
                tracing::warn!("{w}");
            }
            chosen.push((name.to_owned(), backend.clone()));
            backend
        };
        let talker = pick(self.talker_backend.as_deref().unwrap_or(&self.backend));
        let code_predictor = pick(self.cp_backend.as_deref().unwrap_or(&self.backend));
        let decoder = pick(self.decoder_backend.as_deref().unwrap_or(&self.backend));
        (
            LmBackends {
                talker,
                code_predictor,
            },
            decoder,
        )
    }
}
