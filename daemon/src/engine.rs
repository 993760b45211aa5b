//! The resident engine: the model loaded on the configured backends, what it offers (speakers,
//! languages), and its warm-up.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use kazeia_engine::lm::LmBackends;
use kazeia_engine::plugins::{backend_named, discover, search_path};
use kazeia_engine::stream::{SessionControl, StreamConfig};
use kazeia_engine::synth::{SynthOptions, Synthesizer, Voice};
use kazeia_engine::Backend;

use crate::config::DaemonConfig;
use crate::model_path::resolve_model;

/// A loaded model and how it was loaded.
pub struct Engine {
    pub synth: Synthesizer,
    pub info: EngineInfo,
    /// The part of the configuration this engine was built from (a change needs a new engine).
    pub key: EngineKey,
}

/// What the adapters show and check requests against.
#[derive(Clone, Debug, Default)]
pub struct EngineInfo {
    /// The model as configured (directory or repo id).
    pub model: String,
    pub model_dir: PathBuf,
    /// Stage → backend actually running it (after any fallback).
    pub backends: BTreeMap<String, String>,
    pub sample_rate: u32,
    pub speakers: Vec<String>,
    /// Model language names (`english`, …), without `auto`.
    pub languages: Vec<String>,
    /// `custom_voice`, `voice_design` or `base`.
    pub model_type: String,
    /// Why this model cannot follow a style instruction, if it cannot.
    pub instruct_refusal: Option<String>,
    /// Width of a speaker vector (the talker's hidden size; cloned voices must match it).
    pub speaker_dim: usize,
    /// Codebooks per frame.
    pub codebooks: usize,
    pub load_time: Duration,
}

/// Configuration values that need the model loaded again when they change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineKey {
    model: String,
    weights: String,
    backends: [String; 3],
    threads: [usize; 3],
    plugin_path: Vec<PathBuf>,
}

impl EngineKey {
    pub fn of(config: &DaemonConfig) -> Self {
        let b = &config.backends;
        let t = &config.threads;
        EngineKey {
            model: config.model.path.clone(),
            weights: config.model.weights.clone(),
            backends: [
                b.talker.clone(),
                b.code_predictor.clone(),
                b.decoder.clone(),
            ],
            threads: [t.talker, t.code_predictor, t.decoder],
            plugin_path: b.plugin_path.clone(),
        }
    }
}

fn threads_or_all(n: usize) -> usize {
    if n > 0 {
        n
    } else {
        std::thread::available_parallelism().map_or(1, usize::from)
    }
}

impl Engine {
    /// Loads the configured model on the configured backends; warnings (backend fallbacks) are logged.
    pub fn load(config: &DaemonConfig) -> Result<Self> {
        let start = Instant::now();
        let dir = resolve_model(&config.model.path)?;
        let plugins = discover(&search_path(&config.backends.plugin_path));
        // One backend per (name, threads), shared by the stages that ask for the same.
        type Chosen = ((String, usize), Arc<dyn Backend>, String);
        let mut chosen: Vec<Chosen> = Vec::new();
        let mut pick = |stage: &str, name: &str, threads: usize| -> (Arc<dyn Backend>, String) {
            let threads = threads_or_all(threads);
            let key = (name.to_owned(), threads);
            if let Some((_, b, actual)) = chosen.iter().find(|(k, _, _)| *k == key) {
                return (b.clone(), actual.clone());
            }
            let (backend, warning) = backend_named(name, threads, &plugins);
            let actual = match warning {
                Some(w) => {
                    eprintln!("kazeiad: warning: {stage}: {w}");
                    if name == "cpu" {
                        "cpu".to_owned()
                    } else {
                        format!("cpu (fallback from {name})")
                    }
                }
                None => name.to_owned(),
            };
            chosen.push((key, backend.clone(), actual.clone()));
            (backend, actual)
        };
        let b = &config.backends;
        let t = &config.threads;
        let (talker, talker_name) = pick("talker", &b.talker, t.talker);
        let (cp, cp_name) = pick("code_predictor", &b.code_predictor, t.code_predictor);
        let (decoder, decoder_name) = pick("decoder", &b.decoder, t.decoder);
        let synth = Synthesizer::load_on(
            &dir,
            LmBackends {
                talker,
                code_predictor: cp,
            },
            decoder,
            config.weight_storage()?,
        )
        .with_context(|| format!("cannot load the model from {}", dir.display()))?;
        let info = EngineInfo {
            model: config.model.path.clone(),
            model_dir: dir,
            backends: BTreeMap::from([
                ("talker".to_owned(), talker_name),
                ("code_predictor".to_owned(), cp_name),
                ("decoder".to_owned(), decoder_name),
            ]),
            sample_rate: synth.sample_rate(),
            speakers: synth
                .model
                .speakers()
                .into_iter()
                .map(str::to_owned)
                .collect(),
            languages: synth
                .model
                .languages()
                .into_iter()
                .filter(|l| *l != "auto")
                .map(str::to_owned)
                .collect(),
            model_type: synth.model.config.model_type().to_owned(),
            instruct_refusal: synth.instruct_refusal(),
            speaker_dim: synth.model.config.talker_config.hidden_size,
            codebooks: synth.model.config.talker_config.num_code_groups,
            load_time: start.elapsed(),
        };
        Ok(Engine {
            synth,
            info,
            key: EngineKey::of(config),
        })
    }

    /// A short synthesis so the first real request finds caches, pools and pages warm.
    pub fn warm_up(&self, voice: &Voice) -> Result<Duration> {
        let start = Instant::now();
        let options = SynthOptions {
            max_new_tokens: Some(4),
            ..SynthOptions::default()
        };
        self.synth.synthesize(
            "Hello.",
            voice,
            &options,
            StreamConfig::default(),
            &SessionControl::new(),
            &mut |_| Ok(()),
        )?;
        Ok(start.elapsed())
    }
}
