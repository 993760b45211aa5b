//! Text → codes: the talker, the code predictor, the sampler and the prompt layouts of Qwen3-TTS-12Hz, loaded
//! from a released model directory.

pub mod batch;
pub mod code_predictor;
pub mod config;
pub mod frame_budget;
pub mod frame_bytes;
pub mod generate;
pub mod prefix_cache;
pub mod prompt;
pub mod sampler;
pub mod talker;
pub mod transformer;

use std::path::Path;
use std::sync::Arc;

use kazeia_backend_abi::Backend;

pub use batch::{generate_batch, BatchFailure, BatchGenerated, BatchOptions, BatchSequence};
pub use config::{GenerationConfig, ModelConfig};
pub use frame_bytes::{BlockBytes, FrameBytes};
pub use generate::{generate, GenerateOptions, GenerateTimings, Generated};
pub use prompt::{build_clone_prompt, build_prompt, ClonePromptParts, Prompt, PromptRequest};
pub use sampler::SamplingParams;

use crate::error::{Error, Result};
use crate::linear::WeightStorage;
use crate::weight_cache::WeightCache;
use crate::weights::{CachedWeights, WeightFile, Weights};

/// The backends of the two LM stages (they may differ: configuration chooses one per stage).
#[derive(Clone)]
pub struct LmBackends {
    pub talker: Arc<dyn Backend>,
    pub code_predictor: Arc<dyn Backend>,
}

impl LmBackends {
    pub fn same(backend: Arc<dyn Backend>) -> Self {
        LmBackends {
            talker: backend.clone(),
            code_predictor: backend,
        }
    }
}

/// The talker and code predictor of one model, resident in their backends.
pub struct TtsModel {
    /// The talker's backend (also used to build prompts).
    pub backend: Arc<dyn Backend>,
    pub cp_backend: Arc<dyn Backend>,
    pub config: ModelConfig,
    pub generation: GenerationConfig,
    pub talker: talker::Talker,
    pub code_predictor: code_predictor::CodePredictor,
}

impl TtsModel {
    /// Loads `config.json`, `generation_config.json` (optional) and `model.safetensors` of a model directory,
    /// with f32 weights.
    pub fn load(dir: &Path, backend: Arc<dyn Backend>) -> Result<Self> {
        Self::load_as(dir, backend, WeightStorage::AsStored)
    }

    /// [`TtsModel::load`] with the talker's and code predictor's linear weights stored as `format`.
    pub fn load_as(dir: &Path, backend: Arc<dyn Backend>, storage: WeightStorage) -> Result<Self> {
        Self::load_on(dir, LmBackends::same(backend), storage)
    }

    /// [`TtsModel::load_as`] with one backend per stage.
    pub fn load_on(dir: &Path, backends: LmBackends, storage: WeightStorage) -> Result<Self> {
        Self::load_cached(dir, backends, storage, None)
    }

    /// [`TtsModel::load_on`] with the converted-weight cache in `cache_dir` (default: see
    /// [`crate::weight_cache`]).
    pub fn load_cached(
        dir: &Path,
        backends: LmBackends,
        storage: WeightStorage,
        cache_dir: Option<&Path>,
    ) -> Result<Self> {
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(Error::Input(format!(
                "{} is not a Qwen3-TTS model directory (no config.json)",
                dir.display()
            )));
        }
        let config = ModelConfig::load(&config_path)?;
        let generation = GenerationConfig::load_or_default(&dir.join("generation_config.json"))?;
        let checkpoint = dir.join("model.safetensors");
        let file = WeightFile::open(&checkpoint)?;
        // Converted layers are cached on disk unless they stay f32 (nothing to save then).
        let variant = format!(
            "{storage}:{}:{}",
            backends.talker.name(),
            backends.code_predictor.name()
        );
        let cache = if storage == WeightStorage::Convert(kazeia_backend_abi::WeightFormat::F32) {
            WeightCache::disabled()
        } else {
            match cache_dir {
                Some(cache_dir) => WeightCache::open_in(cache_dir, &checkpoint, &variant),
                None => WeightCache::open(&checkpoint, &variant),
            }
        };
        let weights = CachedWeights { file: &file, cache };
        let model = Self::from_parts(config, generation, &weights, backends, storage)?;
        // A cache that cannot be written only costs the next start its conversion time.
        let _ = weights.cache.save();
        Ok(model)
    }

    pub fn from_parts(
        config: ModelConfig,
        generation: GenerationConfig,
        weights: &dyn Weights,
        backends: LmBackends,
        storage: WeightStorage,
    ) -> Result<Self> {
        let t = &config.talker_config;
        let talker = talker::Talker::load(backends.talker.as_ref(), weights, t, storage)?;
        let code_predictor = code_predictor::CodePredictor::load(
            backends.code_predictor.as_ref(),
            weights,
            &t.code_predictor_config,
            t.hidden_size,
            storage,
        )?;
        Ok(TtsModel {
            backend: backends.talker,
            cp_backend: backends.code_predictor,
            config,
            generation,
            talker,
            code_predictor,
        })
    }

    pub fn prompt(&self, request: &PromptRequest) -> Result<Prompt> {
        build_prompt(self.backend.as_ref(), &self.config, &self.talker, request)
    }

    /// The prompt of a Base model's cloned voice (x-vector, and in-context the reference).
    pub fn clone_prompt(
        &self,
        request: &PromptRequest,
        clone: &ClonePromptParts<'_>,
    ) -> Result<Prompt> {
        if self.config.model_type() != "base" {
            return Err(Error::Input(format!(
                "cloned voices need a Base model; this one is {}",
                self.config.model_type()
            )));
        }
        build_clone_prompt(
            self.backend.as_ref(),
            &self.config,
            &self.talker,
            &self.code_predictor,
            request,
            clone,
        )
    }

    /// The options of `generation_config.json`, greedy if asked.
    pub fn default_options(&self, greedy: bool) -> GenerateOptions {
        let g = &self.generation;
        GenerateOptions {
            talker: SamplingParams {
                do_sample: g.do_sample && !greedy,
                temperature: g.temperature,
                top_k: g.top_k,
                top_p: g.top_p,
            },
            code_predictor: SamplingParams {
                do_sample: g.subtalker_dosample && !greedy,
                temperature: g.subtalker_temperature,
                top_k: g.subtalker_top_k,
                top_p: g.subtalker_top_p,
            },
            repetition_penalty: g.repetition_penalty,
            max_new_tokens: g.max_new_tokens,
            ignore_eos: false,
            text_budget: false,
        }
    }

    /// Speaker names this model knows (CustomVoice), sorted.
    pub fn speakers(&self) -> Vec<&str> {
        self.config
            .talker_config
            .spk_id
            .keys()
            .map(String::as_str)
            .collect()
    }

    /// Languages this model accepts: `auto` and every non-dialect language.
    pub fn languages(&self) -> Vec<&str> {
        std::iter::once("auto")
            .chain(
                self.config
                    .talker_config
                    .codec_language_id
                    .keys()
                    .map(String::as_str)
                    .filter(|l| !l.contains("dialect")),
            )
            .collect()
    }
}
