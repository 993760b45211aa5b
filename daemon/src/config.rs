//! The daemon's configuration (`kazeia.toml`): where it is looked for, what it holds, how it is checked.
//!
//! The shipped file `config/kazeia.toml` documents every key; with no file at all, [`DaemonConfig::default`]
//! applies, and a test keeps the two equal.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use kazeia_engine::codec::DecoderPrecision;
use kazeia_engine::weights_auto::WeightsSetting;
use serde::Deserialize;

use crate::audio::SinkSpec;

/// The shipped, commented default configuration.
pub const SHIPPED: &str = include_str!("../../config/kazeia.toml");

#[derive(Clone, Debug, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonConfig {
    pub model: ModelSection,
    pub voice: VoiceSection,
    pub backends: BackendsSection,
    pub threads: ThreadsSection,
    pub audio: AudioSection,
    pub queue: QueueSection,
    pub stream: StreamSection,
    pub generation: GenerationSection,
    pub log: LogSection,
    /// Named voices (`[voices.NAME]`), listed beside the model's own.
    pub voices: BTreeMap<String, NamedVoice>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// `error`, `warn`, `info`, `debug`, `trace`, or `tracing` directives; `RUST_LOG` overrides it.
    pub level: String,
}

impl Default for LogSection {
    fn default() -> Self {
        LogSection {
            level: crate::logging::DEFAULT_LEVEL.into(),
        }
    }
}

/// A voice described in words (`[voices.NAME]`): VoiceDesign models, or a 1.7B CustomVoice speaker with a
/// style.
#[derive(Clone, Debug, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct NamedVoice {
    /// The description, e.g. "A calm, low female voice, speaking slowly".
    pub instruct: String,
    /// CustomVoice models: the speaker it styles; empty: the default speaker.
    pub speaker: String,
    /// A language it speaks by default; empty: the request's or `[voice] language`.
    pub language: String,
}

#[derive(Clone, Debug, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct GenerationSection {
    /// Greedy decoding instead of the model's sampling (the same text then always sounds the same).
    pub greedy: bool,
    /// Cap on the 80 ms frames generated per chunk of text; 0: a cap from the chunk's length
    /// ([`kazeia_engine::lm::frame_budget`]).
    pub max_frames: usize,
    /// Where the talker reads the text.
    pub text: TextMode,
}

/// Where the talker reads the text: both are the official model's modes (its `non_streaming_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TextMode {
    /// As the official wrapper does for the model type: in the prompt for CustomVoice and VoiceDesign,
    /// streamed for Base (cloned voices).
    #[default]
    Auto,
    /// The whole text in the prompt (`non_streaming_mode=True`): the first sound waits for its prefill.
    Prompt,
    /// One text token per generated frame (`non_streaming_mode=False`): the prefill is one row past the
    /// voice's fixed rows, whatever the text's length, so the first sound comes sooner.
    Streamed,
}

impl TextMode {
    /// The engine's `Voice::non_streaming_mode` for this choice (`None`: the model type's default).
    pub fn non_streaming_mode(self) -> Option<bool> {
        match self {
            TextMode::Auto => None,
            TextMode::Prompt => Some(true),
            TextMode::Streamed => Some(false),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// A model directory in the released layout, or a Hugging Face repo id.
    pub path: String,
    /// Storage of the talker's and code predictor's linear weights.
    pub weights: String,
    /// Whether the daemon may download `path` (a repo id not in the cache) by itself. Off by default: a
    /// model is gigabytes, which a metered connection should not pay for unasked; `kazeia model download`
    /// gets it, showing its size first, and the daemon then loads it.
    pub download: bool,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VoiceSection {
    /// Speaker; empty: the model's first.
    pub speaker: String,
    pub language: String,
    pub instruct: String,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackendsSection {
    pub talker: String,
    pub code_predictor: String,
    pub decoder: String,
    pub plugin_path: Vec<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ThreadsSection {
    /// 0: every CPU.
    pub talker: usize,
    pub code_predictor: usize,
    pub decoder: usize,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AudioSection {
    /// `pipewire`, `pipewire:TARGET`, `wav:PATH` or `null`.
    pub sink: String,
}

/// Most Spiel streams one may configure (`[queue] spiel_streams`).
pub const MAX_SPIEL_STREAMS: usize = 16;

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueSection {
    /// Utterances waiting or speaking at once, over all clients.
    pub max_utterances: usize,
    /// Longest text accepted in one request, in bytes.
    pub max_text_bytes: usize,
    /// Utterances one client (a process, over all its connections) may have waiting or speaking at once.
    pub max_per_client: usize,
    /// Spiel streams generated at once, one per client (each connection's in order).
    pub spiel_streams: usize,
    /// A Spiel client reading behind real time (beyond a 1 s grace) this long is dropped (its utterance
    /// `cancelled`), at once if another client waits for a stream.
    pub stall_timeout_ms: u64,
    /// An interrupted `message`/`text` is resumed later instead of cancelled (not speech-dispatcher's model).
    pub resume_interrupted: bool,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StreamSection {
    /// Frames (80 ms each) in the first decoded chunk: the time to first sound.
    pub first_chunk_frames: usize,
    /// Frames in the largest later chunk (from the first they grow by one frame every third chunk, up to this).
    pub chunk_frames: usize,
    /// The first chunk's sound is handed out in this many parts, each as soon as it is decoded
    /// (`StreamConfig::first_chunk_parts`): 1 = the whole chunk at once.
    pub first_chunk_parts: usize,
    /// Chunks of one text (sentences) generated together, one row each per talker and code-predictor step
    /// (`StreamConfig::batch`); 1 = one after the other. Audio still comes in order, and the first chunk's
    /// first sound waits for no other.
    pub batch: usize,
    /// On a machine slower than real time, start playing once the rest will arrive in time (`audio::plan`),
    /// so speech has no gap; false plays the first chunk at once, gaps and all.
    pub gapless: bool,
    /// The codec decoder's precision: `exact`, or `fast` (faster convolutions, not exact: within 40 dB SNR of
    /// the exact decoder; the CPU backend only). See [`DaemonConfig::decoder_precision`].
    pub decoder: String,
}

impl Default for ModelSection {
    fn default() -> Self {
        ModelSection {
            path: "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice".into(),
            weights: "auto".into(),
            download: false,
        }
    }
}

impl Default for VoiceSection {
    fn default() -> Self {
        VoiceSection {
            speaker: String::new(),
            language: "auto".into(),
            instruct: String::new(),
        }
    }
}

impl Default for BackendsSection {
    fn default() -> Self {
        BackendsSection {
            talker: "cpu".into(),
            code_predictor: "cpu".into(),
            decoder: "cpu".into(),
            plugin_path: Vec::new(),
        }
    }
}

impl Default for AudioSection {
    fn default() -> Self {
        AudioSection {
            sink: "pipewire".into(),
        }
    }
}

impl Default for QueueSection {
    fn default() -> Self {
        QueueSection {
            max_utterances: 256,
            max_text_bytes: 1 << 20,
            max_per_client: 64,
            spiel_streams: 4,
            stall_timeout_ms: 5000,
            resume_interrupted: false,
        }
    }
}

impl Default for StreamSection {
    fn default() -> Self {
        StreamSection {
            first_chunk_frames: 1,
            chunk_frames: 8,
            first_chunk_parts: 2,
            batch: 4,
            gapless: true,
            decoder: "exact".into(),
        }
    }
}

impl DaemonConfig {
    /// Parses and checks a configuration text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        let config: DaemonConfig =
            toml::from_str(text).with_context(|| format!("{origin}: invalid configuration"))?;
        config
            .validate()
            .with_context(|| format!("{origin}: invalid configuration"))?;
        Ok(config)
    }

    /// Reads a configuration file.
    pub fn load(path: &Path) -> Result<Self> {
        Ok(read_file(path)?.0)
    }

    /// Values the types cannot check.
    pub fn validate(&self) -> Result<()> {
        if self.model.path.trim().is_empty() {
            bail!("[model] path is empty");
        }
        self.weights_setting()?;
        self.sink()?;
        for (stage, name) in [
            ("talker", &self.backends.talker),
            ("code_predictor", &self.backends.code_predictor),
            ("decoder", &self.backends.decoder),
        ] {
            if name.trim().is_empty() {
                bail!("[backends] {stage} is empty (use \"cpu\" or a plugin's name)");
            }
        }
        let q = &self.queue;
        if [
            q.max_utterances,
            q.max_text_bytes,
            q.max_per_client,
            q.spiel_streams,
        ]
        .contains(&0)
            || q.stall_timeout_ms == 0
        {
            bail!("[queue] limits must be positive");
        }
        if q.spiel_streams > MAX_SPIEL_STREAMS {
            bail!(
                "[queue] spiel_streams = {} is more than {MAX_SPIEL_STREAMS}: each stream is a thread and a \
                 session of the model (its own keys and values)",
                q.spiel_streams
            );
        }
        if self.stream.first_chunk_frames == 0
            || self.stream.chunk_frames == 0
            || self.stream.first_chunk_parts == 0
            || self.stream.batch == 0
        {
            bail!(
                "[stream] first_chunk_frames, chunk_frames, first_chunk_parts and batch must be positive"
            );
        }
        self.decoder_precision()?;
        if self.voice.language.trim().is_empty() {
            bail!("[voice] language is empty (use \"auto\")");
        }
        crate::logging::parse_level(&self.log.level)
            .map_err(|e| anyhow::anyhow!("[log] level: {e}"))?;
        for (name, voice) in &self.voices {
            crate::voice_store::check_name(name)
                .map_err(|e| anyhow::anyhow!("[voices.{name}]: {e}"))?;
            if voice.instruct.trim().is_empty() {
                bail!("[voices.{name}] has no instruct (describe the voice in words)");
            }
        }
        Ok(())
    }

    /// `[stream] decoder`: `exact` or `fast`.
    pub fn decoder_precision(&self) -> Result<DecoderPrecision> {
        self.stream
            .decoder
            .parse()
            .map_err(|e| anyhow::anyhow!("[stream] decoder: {e}"))
    }

    /// `[model] weights`: a format, always obeyed, or `auto`: the most precise format this machine keeps
    /// comfortably faster than real time, measured once at load ([`kazeia_engine::weights_auto`]).
    pub fn weights_setting(&self) -> Result<WeightsSetting> {
        self.model
            .weights
            .parse()
            .map_err(|e| anyhow::anyhow!("[model] weights: {e}"))
    }

    pub fn sink(&self) -> Result<SinkSpec> {
        self.audio
            .sink
            .parse()
            .map_err(|e| anyhow::anyhow!("[audio] sink: {e}"))
    }
}

/// Where the configuration comes from: `--config`, else `$XDG_CONFIG_HOME/kazeia/kazeia.toml` (or
/// `~/.config/…`), else `/etc/kazeia/kazeia.toml`; `None` when none exists (built-in defaults).
pub fn config_path(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(path) = explicit {
        return Some(path.to_path_buf());
    }
    let user = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .map(|dir| dir.join("kazeia/kazeia.toml"));
    let system = PathBuf::from("/etc/kazeia/kazeia.toml");
    user.into_iter().chain([system]).find(|p| p.is_file())
}

/// Loads the configuration from [`config_path`] or the defaults.
pub fn load(explicit: Option<&Path>) -> Result<(DaemonConfig, Option<PathBuf>)> {
    match config_path(explicit) {
        Some(path) => Ok((DaemonConfig::load(&path)?, Some(path))),
        None => Ok((DaemonConfig::default(), None)),
    }
}

/// A configuration file's settings and its text. An empty file is refused: an editor that truncates a file
/// before writing it shows one for a moment, and applying it would put every setting back to its default.
pub fn read_file(path: &Path) -> Result<(DaemonConfig, String)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse_file(&text, path)
}

/// [`read_file`] on a text already read from `path`.
pub fn parse_file(text: &str, path: &Path) -> Result<(DaemonConfig, String)> {
    if text.trim().is_empty() {
        bail!(
            "{} is empty (still being written?); delete it to use the defaults",
            path.display()
        );
    }
    let config = DaemonConfig::parse(text, &path.display().to_string())?;
    Ok((config, text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_file_equals_the_defaults() {
        let shipped = DaemonConfig::parse(SHIPPED, "config/kazeia.toml").unwrap();
        assert_eq!(shipped, DaemonConfig::default());
    }

    /// `auto` by default (chosen per machine at load); a named format is taken as it is.
    #[test]
    fn weights_are_auto_or_a_named_format() {
        use kazeia_engine::{WeightFormat, WeightStorage};
        assert_eq!(
            DaemonConfig::default().weights_setting().unwrap(),
            WeightsSetting::Auto
        );
        for (text, format) in [("bf16", WeightFormat::BF16), ("q4_0", WeightFormat::Q4_0)] {
            let c = DaemonConfig::parse(&format!("[model]\nweights = \"{text}\"\n"), "t").unwrap();
            assert_eq!(
                c.weights_setting().unwrap(),
                WeightsSetting::Fixed(WeightStorage::Convert(format))
            );
        }
    }

    #[test]
    fn partial_files_keep_defaults() {
        let c = DaemonConfig::parse("[backends]\ndecoder = \"vulkan\"\n", "t").unwrap();
        assert_eq!(c.backends.decoder, "vulkan");
        assert_eq!(c.backends.talker, "cpu");
        assert_eq!(c.model, ModelSection::default());
    }

    #[test]
    fn the_decoder_is_exact_unless_fast_is_asked() {
        assert_eq!(
            DaemonConfig::default().decoder_precision().unwrap(),
            DecoderPrecision::Exact
        );
        let c = DaemonConfig::parse("[stream]\ndecoder = \"fast\"\n", "t").unwrap();
        assert_eq!(c.decoder_precision().unwrap(), DecoderPrecision::Fast);
    }

    #[test]
    fn text_modes_map_to_the_official_flag() {
        for (value, mode, flag) in [
            ("auto", TextMode::Auto, None),
            ("prompt", TextMode::Prompt, Some(true)),
            ("streamed", TextMode::Streamed, Some(false)),
        ] {
            let c =
                DaemonConfig::parse(&format!("[generation]\ntext = \"{value}\"\n"), "t").unwrap();
            assert_eq!(c.generation.text, mode);
            assert_eq!(mode.non_streaming_mode(), flag);
        }
    }

    #[test]
    fn bad_files_are_rejected_with_the_reason() {
        for (text, needle) in [
            ("[model]\npath = 3\n", "invalid type"),
            ("[modle]\n", "unknown field"),
            ("[model]\nweights = \"q3\"\n", "weights"),
            ("[audio]\nsink = \"speaker\"\n", "sink"),
            ("[queue]\nmax_utterances = 0\n", "queue"),
            ("[queue]\nspiel_streams = 1000\n", "spiel_streams"),
            ("[stream]\nchunk_frames = 0\n", "stream"),
            ("[stream]\nfirst_chunk_parts = 0\n", "first_chunk_parts"),
            (
                "[stream]\ndecoder = \"quick\"\n",
                "[stream] decoder: unknown decoder precision `quick`",
            ),
            (
                "[generation]\ntext = \"later\"\n",
                "unknown variant `later`",
            ),
            ("[backends]\ndecoder = \"\"\n", "decoder"),
            ("[voices.calm]\nspeaker = \"ryan\"\n", "no instruct"),
            (
                "[voices.\"Bad Name\"]\ninstruct = \"x\"\n",
                "voices.Bad Name",
            ),
            (
                "[voices.calm]\ninstruct = \"x\"\ncolour = 1\n",
                "unknown field",
            ),
            ("not toml at all [", "invalid configuration"),
        ] {
            let e = format!("{:#}", DaemonConfig::parse(text, "f.toml").unwrap_err());
            assert!(e.contains(needle), "{text:?}: {e}");
            assert!(e.starts_with("f.toml"), "{e}");
        }
    }
}
