//! Text → waveform: tokenizer, talker + code predictor, codec decoder, with long text split into chunks that
//! are synthesised in order and streamed out as they are decoded.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use kazeia_backend_abi::Backend;

use crate::codec::{CodecDecoder, DecoderState};
use crate::error::{Error, Result};
use crate::fallback::{CpuFallback, LmStages, Stage, Stages};
use crate::linear::WeightStorage;
use crate::lm::code_predictor::CodePredictor;
use crate::lm::sampler::random_seed;
use crate::lm::talker::Talker;
use crate::lm::{
    build_clone_prompt, build_prompt, ClonePromptParts, LmBackends, Prompt, PromptRequest, TtsModel,
};
use crate::marks::{MarkPlan, SpeakingRate};
use crate::stream::{
    stream_utterances, SessionControl, StreamConfig, StreamEvent, StreamReport, Utterance,
};
use crate::tokenizer::TextTokenizer;
use kazeia_text::text::chunk_ranges;

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
    /// Each chunk also stops at a limit from its length ([`crate::lm::frame_budget`]), so a generation the model
    /// never ends is cut after seconds, not minutes ([`crate::stream::StreamReport::cut`] counts them).
    pub text_budget: bool,
    /// Generate up to the frame cap even where the model ends the speech (tests and measurements of long
    /// speech on random models).
    pub ignore_eos: bool,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            greedy: false,
            seed: None,
            max_new_tokens: None,
            chunk_chars: kazeia_text::text::DEFAULT_CHUNK_CHARS,
            text_budget: true,
            ignore_eos: false,
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
    /// This voice's pace, learned as it speaks: where marks fall before an utterance's end is known.
    pub speaking_rate: SpeakingRate,
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
        let codec = CodecDecoder::load_as(dir, decoder, storage.decoder_format())?;
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
            speaking_rate: SpeakingRate::default(),
        })
    }

    /// The prompt of `request`, built with the talker running now (moved to the CPU if its backend fails).
    pub fn prompt(&self, request: &PromptRequest) -> Result<Prompt> {
        self.on_talker(|backend, talker| build_prompt(backend, &self.model.config, talker, request))
    }

    /// Runs `build` with the talker running now; a backend failure moves the talker to the CPU and runs it
    /// again there.
    fn on_talker(&self, build: impl Fn(&dyn Backend, &Talker) -> Result<Prompt>) -> Result<Prompt> {
        let run = || {
            let (backend, talker) = self.talker();
            build(backend, talker)
        };
        match run() {
            Err(e @ Error::Backend { .. }) if !self.fallback.has_moved(Stage::Talker) => {
                self.recover(Stage::Talker, e)?;
                run()
            }
            other => other,
        }
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
            input_ids: self.tokenizer.assistant_ids(text)?,
            instruct_ids: instruct
                .map(|i| self.tokenizer.instruct_ids(i))
                .transpose()?,
            speaker: voice.speaker.clone(),
            language: voice.language.clone(),
            non_streaming_mode: voice
                .non_streaming_mode
                .unwrap_or_else(|| config.default_non_streaming_mode()),
        })
    }

    /// The prompt of one chunk of text in `voice`: a cloned voice's (x-vector, and in-context the reference,
    /// with the decoder primed by it) or the model's own.
    pub fn voice_prompt(
        &self,
        text: &str,
        voice: &Voice,
        warnings: &mut Vec<String>,
    ) -> Result<Prompt> {
        let request = self.request(text, voice, warnings)?;
        let Some(clone) = &voice.clone else {
            return self.prompt(&request);
        };
        let config = &self.model.config;
        if config.model_type() != "base" {
            return Err(Error::Input(format!(
                "cloned voices need a Base model; this one is {}",
                config.model_type()
            )));
        }
        let ref_ids = match &clone.ref_text {
            Some(t) if clone.in_context() => Some(self.tokenizer.reference_ids(t)?),
            _ => None,
        };
        let parts = ClonePromptParts {
            xvector: &clone.xvector,
            reference: ref_ids
                .as_deref()
                .map(|ids| (ids, clone.ref_codes.as_slice())),
        };
        let mut prompt = self.on_talker(|backend, talker| {
            let (_, cp) = self.code_predictor();
            build_clone_prompt(backend, config, talker, cp, &request, &parts)
        })?;
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
        // The state holds no backend memory, so one made on the decoder running now serves on any.
        let decode = || {
            let decoder = self.decoder();
            let mut state = decoder.new_state();
            decoder.decode_chunk(&mut state, &clone.ref_codes)?;
            Ok(state)
        };
        let state = match decode() {
            Err(e @ Error::Backend { .. }) if self.can_recover(Stage::Decoder) => {
                self.recover(Stage::Decoder, e)?;
                decode()
            }
            other => other,
        }?;
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
        self.synthesize_marked(
            text,
            &[],
            voice,
            options,
            stream,
            control,
            &mut |event| match event {
                StreamEvent::Audio(samples) => on_audio(samples),
                StreamEvent::Mark(_) => Ok(()),
            },
        )
    }

    /// [`Synthesizer::synthesize`] with index marks at byte offsets `marks` of `text` (in order): the text
    /// is generated as it would be without them (one generation per sentence-sized chunk, not per mark), and
    /// `StreamEvent::Mark(i)` for `marks[i]` comes between the samples where that point of the text is
    /// estimated to be spoken ([`crate::marks`]). Every mark is handed out once, in order, unless the
    /// session is stopped first.
    #[allow(clippy::too_many_arguments)]
    pub fn synthesize_marked(
        &self,
        text: &str,
        marks: &[usize],
        voice: &Voice,
        options: &SynthOptions,
        stream: StreamConfig,
        control: &SessionControl,
        on_event: &mut (dyn FnMut(StreamEvent) -> Result<()> + Send),
    ) -> Result<(StreamReport, Vec<String>)> {
        let chunks = chunk_ranges(text, options.chunk_chars);
        if chunks.is_empty() {
            return Err(Error::Input("the text is empty: nothing to say".into()));
        }
        // Each mark goes with the first chunk that ends after it (the last one if none does), at its
        // offset in that chunk.
        let mut plans: Vec<Vec<(usize, usize)>> = vec![Vec::new(); chunks.len()];
        for (id, &offset) in marks.iter().enumerate() {
            let c = chunks
                .iter()
                .position(|r| r.end > offset)
                .unwrap_or(chunks.len() - 1);
            plans[c].push((id, offset.saturating_sub(chunks[c].start)));
        }
        let utterance = |c: usize, warnings: &mut Vec<String>| -> Result<Utterance> {
            let chunk = &text[chunks[c].clone()];
            Ok(Utterance {
                prompt: self.voice_prompt(chunk, voice, warnings)?,
                marks: MarkPlan::new(chunk, &plans[c]),
            })
        };
        // Check the voice once, up front, so a bad speaker fails before any audio.
        let mut warnings = Vec::new();
        let first = utterance(0, &mut warnings)?;

        let mut gen_options = self.model.default_options(options.greedy);
        if let Some(n) = options.max_new_tokens {
            gen_options.max_new_tokens = n;
        }
        gen_options.text_budget = options.text_budget;
        gen_options.ignore_eos = options.ignore_eos;
        // The first prompt is the one just checked; the rest are built as generation reaches them.
        let rest = (1..chunks.len()).map(|c| utterance(c, &mut Vec::new()));
        let mut utterances = std::iter::once(Ok(first)).chain(rest);
        let seed = options.seed.unwrap_or_else(random_seed);
        let report = stream_utterances(
            self,
            &mut utterances,
            &gen_options,
            seed,
            stream,
            control,
            &self.speaking_rate,
            on_event,
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
