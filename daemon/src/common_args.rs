//! Options shared by the commands that run the model.

use clap::Args;
use kazeia_engine::{CpuBackend, WeightStorage};

#[derive(Args)]
pub struct SamplingArgs {
    /// Greedy decoding for the talker and the code predictor (instead of sampling).
    #[arg(long)]
    pub greedy: bool,
    /// Seed of the sampler (reproducible sampling).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Codebook-0 tokens to sample at most (official meaning: at most N − 1 frames come out; per text chunk
    /// for synth). Default: generation_config.json.
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Text placement in the prompt; default: the official wrapper's default for the model type.
    #[arg(long)]
    pub non_streaming_mode: Option<bool>,
}

#[derive(Args)]
pub struct EngineArgs {
    /// Storage of the talker's and code predictor's weights: auto (as stored in the checkpoint: BF16 for the
    /// released models, lossless), f32, f16, bf16, q8_0 or q4_0.
    #[arg(long, default_value = "auto")]
    pub weights: WeightStorage,
    /// Worker threads for the CPU backend.
    #[arg(long, default_value_t = crate::default_threads())]
    pub threads: usize,
}

impl EngineArgs {
    pub fn backend(&self) -> std::sync::Arc<CpuBackend> {
        std::sync::Arc::new(CpuBackend::new(self.threads))
    }
}
