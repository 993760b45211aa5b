//! A backend that fails at run time costs its stage, not the speech: the stage moves to the built-in CPU backend
//! and the work in progress is redone there.
//!
//! Sessions reach their stages through [`Stages`]. When a stage's ops fail ([`Error::Backend`]), the session calls
//! [`LmStages::recover`] and redoes the stage's current work on what [`LmStages::talker`] and the others return
//! then:
//! - talker: a new KV cache, rebuilt by prefilling the piece's prompt (its fixed rows as the talker keeps
//!   them) and running every frame fed back so far as one batch (the cache then holds what the failed one
//!   should have);
//! - code predictor: its cache lives for one frame, so the frame is predicted again;
//! - decoder: the decoder state saved before the failed chunk is restored and the chunk decoded again.
//!
//! Audio already delivered stays delivered and nothing is spoken twice. [`CpuFallback`] loads a CPU copy of a
//! stage the first time it fails (one warning), and keeps it for the life of the synthesizer: a new synthesizer
//! (the daemon's reload) tries the configured backend again. A stage that fails on its CPU copy fails the
//! session: each session recovers a stage at most once.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use kazeia_backend_abi::Backend;

use crate::codec::CodecDecoder;
use crate::error::{Error, Result};
use crate::linear::WeightStorage;
use crate::lm::code_predictor::CodePredictor;
use crate::lm::talker::Talker;
use crate::lm::{ModelConfig, TtsModel};
use crate::weight_cache::WeightCache;
use crate::weights::{CachedWeights, WeightFile};
use crate::CpuBackend;

/// A stage of synthesis that runs on a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    Talker,
    CodePredictor,
    Decoder,
}

impl Stage {
    pub const ALL: [Stage; 3] = [Stage::Talker, Stage::CodePredictor, Stage::Decoder];

    /// The name configuration and the daemon's `Backends` property use.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Talker => "talker",
            Stage::CodePredictor => "code_predictor",
            Stage::Decoder => "decoder",
        }
    }
}

/// Where a generation finds the talker and the code predictor, and what it does when one fails.
pub trait LmStages: Sync {
    /// The model's configuration and its stages as loaded.
    fn model(&self) -> &TtsModel;

    /// The talker and the backend it runs on now.
    fn talker(&self) -> (&dyn Backend, &Talker) {
        let m = self.model();
        (m.backend.as_ref(), &m.talker)
    }

    /// The code predictor and the backend it runs on now.
    fn code_predictor(&self) -> (&dyn Backend, &CodePredictor) {
        let m = self.model();
        (m.cp_backend.as_ref(), &m.code_predictor)
    }

    /// Whether a failure of `stage` can be recovered (so its work is worth saving before it runs).
    fn can_recover(&self, _stage: Stage) -> bool {
        false
    }

    /// `stage` failed with `error`: moves it elsewhere so its work can be redone (`Ok`), or gives `error` back.
    fn recover(&self, _stage: Stage, error: Error) -> Result<()> {
        Err(error)
    }
}

/// A model as loaded, with no recovery.
impl LmStages for TtsModel {
    fn model(&self) -> &TtsModel {
        self
    }
}

/// [`LmStages`] and the codec decoder: what a streaming session runs.
pub trait Stages: LmStages {
    /// The decoder as it runs now.
    fn decoder(&self) -> &CodecDecoder;
}

/// A model and a decoder as they are, with no recovery (benchmarks, tests).
pub struct FixedStages<'a> {
    pub model: &'a TtsModel,
    pub codec: &'a CodecDecoder,
}

impl LmStages for FixedStages<'_> {
    fn model(&self) -> &TtsModel {
        self.model
    }
}

impl Stages for FixedStages<'_> {
    fn decoder(&self) -> &CodecDecoder {
        self.codec
    }
}

/// Told when a stage moves to the CPU: the stage and the failure, once per stage.
pub type FallbackLog = dyn Fn(Stage, &str) + Send + Sync;

/// CPU copies of a model directory's stages, each loaded the first time its configured backend fails.
pub struct CpuFallback {
    dir: PathBuf,
    storage: WeightStorage,
    /// Threads of the CPU backend per stage.
    threads: [usize; 3],
    talker: OnceLock<(Arc<dyn Backend>, Talker)>,
    code_predictor: OnceLock<(Arc<dyn Backend>, CodePredictor)>,
    decoder: OnceLock<CodecDecoder>,
    /// Why each stage moved, once it has.
    reasons: Mutex<Vec<(Stage, String)>>,
    /// One stage loads at a time.
    loading: Mutex<()>,
    log: Box<FallbackLog>,
}

impl CpuFallback {
    /// Copies of the stages of the model in `dir`, their LM weights stored as `storage`; failures are logged to
    /// stderr until [`CpuFallback::set_log`].
    pub fn new(dir: &Path, storage: WeightStorage) -> Self {
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        CpuFallback {
            dir: dir.to_owned(),
            storage,
            threads: [threads; 3],
            talker: OnceLock::new(),
            code_predictor: OnceLock::new(),
            decoder: OnceLock::new(),
            reasons: Mutex::new(Vec::new()),
            loading: Mutex::new(()),
            log: Box::new(|stage, why| tracing::warn!("{}: {why}; moved to the CPU", stage.name())),
        }
    }

    /// CPU threads per stage (talker, code predictor, decoder); 0 keeps the default (all).
    pub fn set_threads(&mut self, threads: [usize; 3]) {
        for (t, n) in self.threads.iter_mut().zip(threads) {
            if n > 0 {
                *t = n;
            }
        }
    }

    pub fn set_log(&mut self, log: Box<FallbackLog>) {
        self.log = log;
    }

    /// The stages that moved to the CPU, with why.
    pub fn moved(&self) -> Vec<(Stage, String)> {
        self.reasons
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn has_moved(&self, stage: Stage) -> bool {
        match stage {
            Stage::Talker => self.talker.get().is_some(),
            Stage::CodePredictor => self.code_predictor.get().is_some(),
            Stage::Decoder => self.decoder.get().is_some(),
        }
    }

    pub fn talker(&self) -> Option<(&dyn Backend, &Talker)> {
        self.talker.get().map(|(b, t)| (b.as_ref(), t))
    }

    pub fn code_predictor(&self) -> Option<(&dyn Backend, &CodePredictor)> {
        self.code_predictor.get().map(|(b, c)| (b.as_ref(), c))
    }

    pub fn decoder(&self) -> Option<&CodecDecoder> {
        self.decoder.get()
    }

    /// Moves `stage` to the CPU after `error` (a session calls this once per stage: a failure on the CPU copy is
    /// final).
    pub fn recover(&self, config: &ModelConfig, stage: Stage, error: Error) -> Result<()> {
        if !matches!(error, Error::Backend { .. }) {
            return Err(error);
        }
        let _one = self.loading.lock().unwrap_or_else(|e| e.into_inner());
        if self.has_moved(stage) {
            // Another session moved it while this one waited.
            return Ok(());
        }
        let why = error.to_string();
        let threads = self.threads[stage as usize];
        let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new(threads));
        let loaded = match stage {
            Stage::Talker => self
                .load_lm(|w| {
                    let t = &config.talker_config;
                    Talker::load(cpu.as_ref(), w, t, self.storage)
                })
                .map(|t| {
                    let _ = self.talker.set((cpu.clone(), t));
                }),
            Stage::CodePredictor => self
                .load_lm(|w| {
                    let t = &config.talker_config;
                    CodePredictor::load(
                        cpu.as_ref(),
                        w,
                        &t.code_predictor_config,
                        t.hidden_size,
                        self.storage,
                    )
                })
                .map(|c| {
                    let _ = self.code_predictor.set((cpu.clone(), c));
                }),
            Stage::Decoder => {
                CodecDecoder::load_as(&self.dir, cpu.clone(), self.storage.decoder_format()).map(
                    |d| {
                        let _ = self.decoder.set(d);
                    },
                )
            }
        };
        loaded.map_err(|e| Error::Backend {
            backend: "cpu".into(),
            message: format!("{why}; and its CPU copy could not be loaded: {e}"),
        })?;
        (self.log)(stage, &why);
        self.reasons
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((stage, why));
        Ok(())
    }

    /// Loads an LM stage from the checkpoint, reading converted layers from the weight cache when a CPU load
    /// left them there (and writing none: the cache file belongs to full loads).
    fn load_lm<T>(&self, load: impl FnOnce(&CachedWeights) -> Result<T>) -> Result<T> {
        let checkpoint = self.dir.join("model.safetensors");
        let file = WeightFile::open(&checkpoint)?;
        let variant = format!("{}:cpu:cpu", self.storage);
        let cache = if self.storage == WeightStorage::Convert(kazeia_backend_abi::WeightFormat::F32)
        {
            WeightCache::disabled()
        } else {
            WeightCache::open(&checkpoint, &variant).read_only()
        };
        load(&CachedWeights { file: &file, cache })
    }
}
