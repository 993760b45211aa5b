//! Text → waveform: tokenizer, talker + code predictor, codec decoder, with long text split into chunks that
//! are synthesised in order and streamed out as they are decoded.

use std::path::Path;
use std::sync::Arc;

use kazeia_backend_abi::Backend;

use crate::codec::CodecDecoder;
use crate::error::{Error, Result};
use crate::fallback::{CpuFallback, LmStages, Stage, Stages};
use crate::linear::WeightStorage;
use crate::lm::code_predictor::CodePredictor;
use crate::lm::sampler::random_seed;
use crate::lm::talker::Talker;
use crate::lm::{build_prompt, LmBackends, Prompt, PromptRequest, TtsModel};
use crate::stream::{stream_on, SessionControl, StreamConfig, StreamReport};
use crate::text::split_for_synthesis;
use crate::tokenizer::{assistant_text, instruct_text, TextTokenizer};

/// Who speaks and how.
#[derive(Clone, Debug, Default)]
pub struct Voice {
    /// CustomVoice speaker name; `None` for models without speakers.
    pub speaker: Option<String>,
    /// A language the model knows, or `auto`.
    pub language: String,
    /// VoiceDesign / 1.7B CustomVoice style instruction.
    pub instruct: Option<String>,
    /// Where the text goes in the prompt; `None`: the official default for the model type.
    pub non_streaming_mode: Option<bool>,
}

#[derive(Clone, Debug)]
pub struct SynthOptions {
    pub greedy: bool,
    /// Seed of the sampler; `None` draws one.
    pub seed: Option<u64>,
    /// Overrides `generation_config.json`'s `max_new_tokens` (per chunk).
    pub max_new_tokens: Option<usize>,
    /// Longest chunk of text synthesised at once.
    pub chunk_chars: usize,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            greedy: false,
            seed: None,
            max_new_tokens: None,
            chunk_chars: crate::text::DEFAULT_CHUNK_CHARS,
        }
    }
}

/// A resident model with its tokenizer and codec. A stage whose backend fails while speaking moves to the CPU
/// ([`crate::fallback`]): `model` and `codec` are the stages as loaded, [`LmStages`] and [`Stages`] give the
/// ones running now.
pub struct Synthesizer {
    pub model: TtsModel,
    pub tokenizer: TextTokenizer,
    pub codec: CodecDecoder,
    pub fallback: CpuFallback,
}

impl Synthesizer {
    /// Loads a released model directory: LM, tokenizer files and `speech_tokenizer/`. The LM's linear
    /// weights are kept as BF16, the released checkpoints' own precision (lossless for them).
    pub fn load(dir: &Path, backend: Arc<dyn Backend>) -> Result<Self> {
        Self::load_as(dir, backend, WeightStorage::AsStored)
    }

    /// [`Synthesizer::load`] with the LM's linear weights stored as `storage`.
    pub fn load_as(dir: &Path, backend: Arc<dyn Backend>, storage: WeightStorage) -> Result<Self> {
        Self::load_on(dir, LmBackends::same(backend.clone()), backend, storage)
    }

    /// [`Synthesizer::load_as`] with one backend per stage.
    pub fn load_on(
        dir: &Path,
        lm: LmBackends,
        decoder: Arc<dyn Backend>,
        storage: WeightStorage,
    ) -> Result<Self> {
        let model = TtsModel::load_on(dir, lm, storage)?;
        let tokenizer = TextTokenizer::load(dir)?;
        let codec = CodecDecoder::load(dir, decoder)?;
        let cb0_range = model.config.talker_config.vocab_size - 1024;
        if cb0_range > codec.config().decoder_config.codebook_size {
            return Err(Error::Input(format!(
                "{}: the talker emits codes up to {cb0_range} but the codec's codebooks hold {}",
                dir.display(),
                codec.config().decoder_config.codebook_size
            )));
        }
        Ok(Synthesizer {
            model,
            tokenizer,
            codec,
            fallback: CpuFallback::new(dir, storage),
        })
    }

    /// The prompt of `request`, built with the talker running now (moved to the CPU if its backend fails).
    pub fn prompt(&self, request: &PromptRequest) -> Result<Prompt> {
        let build = || {
            let (backend, talker) = self.talker();
            build_prompt(backend, &self.model.config, talker, request)
        };
        match build() {
            Err(e @ Error::Backend { .. }) if !self.fallback.has_moved(Stage::Talker) => {
                self.recover(Stage::Talker, e)?;
                build()
            }
            other => other,
        }
    }

    pub fn sample_rate(&self) -> u32 {
        self.codec.sample_rate()
    }

    /// The prompt request for one chunk of text, as the official wrapper builds it.
    pub fn request(
        &self,
        text: &str,
        voice: &Voice,
        warnings: &mut Vec<String>,
    ) -> Result<PromptRequest> {
        let config = &self.model.config;
        let mut instruct = voice.instruct.as_deref().filter(|s| !s.trim().is_empty());
        if instruct.is_some() && config.drops_instruct() {
            warnings.push(
                "this model (0.6B CustomVoice) ignores instructions, as the official one does"
                    .into(),
            );
            instruct = None;
        }
        Ok(PromptRequest {
            input_ids: self.tokenizer.encode(&assistant_text(text))?,
            instruct_ids: instruct
                .map(|i| self.tokenizer.encode(&instruct_text(i)))
                .transpose()?,
            speaker: voice.speaker.clone(),
            language: voice.language.clone(),
            non_streaming_mode: voice
                .non_streaming_mode
                .unwrap_or_else(|| config.default_non_streaming_mode()),
        })
    }

    /// Synthesises `text` as a stream: chunks of audio go to `on_audio` (from the decoder thread) as soon as
    /// they are decoded; `control` stops or pauses it from any thread. Returns the session report and any
    /// warnings about the voice.
    pub fn synthesize(
        &self,
        text: &str,
        voice: &Voice,
        options: &SynthOptions,
        stream: StreamConfig,
        control: &SessionControl,
        on_audio: &mut (dyn FnMut(&[f32]) -> Result<()> + Send),
    ) -> Result<(StreamReport, Vec<String>)> {
        let chunks = split_for_synthesis(text, options.chunk_chars);
        if chunks.is_empty() {
            return Err(Error::Input("the text is empty: nothing to say".into()));
        }
        // Check the voice once, up front, so a bad speaker fails before any audio.
        let mut warnings = Vec::new();
        let first = self.prompt(&self.request(&chunks[0], voice, &mut warnings)?)?;

        let mut gen_options = self.model.default_options(options.greedy);
        if let Some(n) = options.max_new_tokens {
            gen_options.max_new_tokens = n;
        }
        // The first prompt is the one just checked; the rest are built as generation reaches them.
        let rest = chunks[1..].iter().map(|chunk| {
            let request = self.request(chunk, voice, &mut Vec::new())?;
            self.prompt(&request)
        });
        let mut prompts = std::iter::once(Ok(first)).chain(rest);
        let seed = options.seed.unwrap_or_else(random_seed);
        let report = stream_on(
            self,
            &mut prompts,
            &gen_options,
            seed,
            stream,
            control,
            on_audio,
        )?;
        Ok((report, warnings))
    }
}

impl LmStages for Synthesizer {
    fn model(&self) -> &TtsModel {
        &self.model
    }

    fn talker(&self) -> (&dyn Backend, &Talker) {
        self.fallback
            .talker()
            .unwrap_or((self.model.backend.as_ref(), &self.model.talker))
    }

    fn code_predictor(&self) -> (&dyn Backend, &CodePredictor) {
        self.fallback
            .code_predictor()
            .unwrap_or((self.model.cp_backend.as_ref(), &self.model.code_predictor))
    }

    fn can_recover(&self, stage: Stage) -> bool {
        !self.fallback.has_moved(stage)
    }

    fn recover(&self, stage: Stage, error: Error) -> Result<()> {
        self.fallback.recover(&self.model.config, stage, error)
    }
}

impl Stages for Synthesizer {
    fn decoder(&self) -> &CodecDecoder {
        self.fallback.decoder().unwrap_or(&self.codec)
    }
}
