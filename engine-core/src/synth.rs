//! Text → waveform: tokenizer, talker + code predictor, codec decoder, with long text split into chunks that
//! are synthesised in order and streamed out as they are decoded.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use kazeia_backend_abi::Backend;

use crate::codec::{CodecDecoder, DecoderState};
use crate::error::{Error, Result};
use crate::linear::WeightStorage;
use crate::lm::sampler::random_seed;
use crate::lm::{ClonePromptParts, LmBackends, Prompt, PromptRequest, TtsModel};
use crate::stream::{stream_speech, SessionControl, StreamConfig, StreamReport};
use crate::text::split_for_synthesis;
use crate::tokenizer::{assistant_text, instruct_text, reference_text, TextTokenizer};

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
    /// Base models: a voice cloned from a recording.
    pub clone: Option<Arc<ClonePrompt>>,
}

/// What a Base model speaks a cloned voice from, computed once from the reference recording.
#[derive(Clone, Default)]
pub struct ClonePrompt {
    /// The speaker encoder's x-vector (talker-wide).
    pub xvector: Vec<f32>,
    /// The reference transcript, with `ref_codes`: in-context cloning; `None`: x-vector only.
    pub ref_text: Option<String>,
    /// The reference recording's codes, `[frame][codebook]`.
    pub ref_codes: Vec<Vec<u32>>,
    /// The decoder state after the reference codes, made on first use and kept: every utterance of the
    /// voice starts from it instead of decoding the reference again.
    primed: OnceLock<Arc<DecoderState>>,
}

impl ClonePrompt {
    pub fn new(xvector: Vec<f32>, ref_text: Option<String>, ref_codes: Vec<Vec<u32>>) -> Self {
        ClonePrompt {
            xvector,
            ref_text,
            ref_codes,
            primed: OnceLock::new(),
        }
    }

    /// In-context cloning (reference transcript and codes), rather than x-vector only.
    pub fn in_context(&self) -> bool {
        self.ref_text.is_some() && !self.ref_codes.is_empty()
    }
}

impl std::fmt::Debug for ClonePrompt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClonePrompt")
            .field("xvector", &format_args!("[{} values]", self.xvector.len()))
            .field("ref_text", &self.ref_text)
            .field("ref_frames", &self.ref_codes.len())
            .finish()
    }
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

/// A resident model with its tokenizer and codec.
pub struct Synthesizer {
    pub model: TtsModel,
    pub tokenizer: TextTokenizer,
    pub codec: CodecDecoder,
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
        })
    }

    pub fn sample_rate(&self) -> u32 {
        self.codec.sample_rate()
    }

    /// Why this model does not follow style instructions, if it does not.
    pub fn instruct_refusal(&self) -> Option<String> {
        let config = &self.model.config;
        if config.drops_instruct() {
            Some(
                "this model (0.6B CustomVoice) ignores instructions, as the official one does; \
                 use a 1.7B CustomVoice or VoiceDesign model"
                    .into(),
            )
        } else if config.model_type() == "base" {
            Some(
                "Base models take no instruction (they speak cloned voices); \
                 use a 1.7B CustomVoice or VoiceDesign model"
                    .into(),
            )
        } else {
            None
        }
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
        if instruct.is_some() {
            if let Some(why) = self.instruct_refusal() {
                warnings.push(format!("the instruction is not used: {why}"));
                instruct = None;
            }
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

    /// The prompt of one chunk of text in `voice`: a cloned voice's (x-vector, reference) or the model's own.
    pub fn prompt(&self, text: &str, voice: &Voice, warnings: &mut Vec<String>) -> Result<Prompt> {
        let request = self.request(text, voice, warnings)?;
        let Some(clone) = &voice.clone else {
            return self.model.prompt(&request);
        };
        let ref_ids = match &clone.ref_text {
            Some(t) if clone.in_context() => Some(self.tokenizer.encode(&reference_text(t))?),
            _ => None,
        };
        let parts = ClonePromptParts {
            xvector: &clone.xvector,
            reference: ref_ids
                .as_deref()
                .map(|ids| (ids, clone.ref_codes.as_slice())),
        };
        let mut prompt = self.model.clone_prompt(&request, &parts)?;
        if parts.reference.is_some() {
            prompt.decoder_start = Some(self.primed_decoder(clone)?);
        }
        Ok(prompt)
    }

    /// Prepares a cloned voice's fixed part ahead of its first utterance (its reference decoded once), so
    /// that its first sound comes as fast as a built-in speaker's.
    pub fn prepare_clone(&self, clone: &ClonePrompt) -> Result<()> {
        if clone.in_context() {
            self.primed_decoder(clone)?;
        }
        Ok(())
    }

    /// The decoder state after a cloned voice's reference codes (decoded once per voice).
    fn primed_decoder(&self, clone: &ClonePrompt) -> Result<Arc<DecoderState>> {
        if let Some(state) = clone.primed.get() {
            return Ok(state.clone());
        }
        let mut state = self.codec.new_state();
        self.codec.decode_chunk(&mut state, &clone.ref_codes)?;
        Ok(clone.primed.get_or_init(|| Arc::new(state)).clone())
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
        let first = self.prompt(&chunks[0], voice, &mut warnings)?;

        let mut gen_options = self.model.default_options(options.greedy);
        if let Some(n) = options.max_new_tokens {
            gen_options.max_new_tokens = n;
        }
        // The first prompt is the one just checked; the rest are built as generation reaches them.
        let rest = chunks[1..]
            .iter()
            .map(|chunk| self.prompt(chunk, voice, &mut Vec::new()));
        let mut prompts = std::iter::once(Ok(first)).chain(rest);
        let seed = options.seed.unwrap_or_else(random_seed);
        let report = stream_speech(
            &self.model,
            &self.codec,
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
