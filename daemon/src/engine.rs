//! The resident engine: the model loaded on the configured backends, what it offers (speakers,
//! languages), and its warm-up; and [`LoadStatus`], what clients see while it downloads and loads.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use kazeia_engine::codec::DecoderPrecision;
use kazeia_engine::fallback::Stage;
use kazeia_engine::lm::LmBackends;
use kazeia_engine::plugins::{backend_named, discover_for, search_path};
use kazeia_engine::stream::{SessionControl, StreamConfig};
use kazeia_engine::synth::{SynthOptions, Synthesizer, Voice};
use kazeia_engine::weights_auto::{self, load_synthesizer, AutoMachine};
use kazeia_engine::Backend;

use crate::config::DaemonConfig;
use crate::model_path::resolve_daemon_model;

/// A loaded model and how it was loaded.
pub struct Engine {
    pub synth: Synthesizer,
    pub info: EngineInfo,
    /// The part of the configuration this engine was built from (a change needs a new engine).
    pub key: EngineKey,
    /// The model's weight files as loaded: a file replaced or rewritten since needs a new engine.
    files: ModelFiles,
    /// The real-time factor `weights = "auto"`'s timed step predicts for the chosen format (none for a named
    /// format): the player's first guess of this machine's speed, before it has measured an utterance.
    pub predicted_rtf: Option<f64>,
}

/// Identity of a model's weight files: (path, (inode, size, modification time)) of each.
pub type ModelFiles = Vec<(PathBuf, Option<(u64, u64, Option<std::time::SystemTime>)>)>;

/// The weight files of the model in `dir` as they are now (through the hub cache's links).
pub fn model_files(dir: &std::path::Path) -> ModelFiles {
    use std::os::unix::fs::MetadataExt;
    ["model.safetensors", "speech_tokenizer/model.safetensors"]
        .iter()
        .map(|f| {
            let path = dir.join(f);
            let stamp = std::fs::metadata(&path)
                .ok()
                .map(|m| (m.ino(), m.len(), m.modified().ok()));
            (path, stamp)
        })
        .collect()
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
    /// The talker's and code predictor's weight format, and why (`weights = "auto"`'s measurement).
    pub weights: String,
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
    /// `[stream] decoder`: the decoder's convolutions are uploaded for it.
    decoder_precision: String,
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
            decoder_precision: config.stream.decoder.clone(),
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

/// What a loaded model offers and runs on: `model` as configured, loaded from `dir`, its stages on `backends`
/// (talker, code predictor, decoder). `kazeia synth` describes its in-process model the same way, so that it
/// finds voices as the daemon does.
pub fn engine_info(
    model: &str,
    dir: PathBuf,
    synth: &Synthesizer,
    backends: [String; 3],
    weights: String,
    load_time: Duration,
) -> EngineInfo {
    let [talker, code_predictor, decoder] = backends;
    EngineInfo {
        model: model.to_owned(),
        model_dir: dir,
        backends: BTreeMap::from([
            ("talker".to_owned(), talker),
            ("code_predictor".to_owned(), code_predictor),
            ("decoder".to_owned(), decoder),
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
        weights,
        load_time,
    }
}

impl Engine {
    /// Loads the configured model on the configured backends; warnings (backend fallbacks) are logged.
    pub fn load(config: &DaemonConfig) -> Result<Self> {
        Self::load_with(config, &LoadStatus::default())
    }

    /// [`Engine::load`], telling `status` how the download and the load go.
    pub fn load_with(config: &DaemonConfig, status: &LoadStatus) -> Result<Self> {
        let start = Instant::now();
        status.set(format!("resolving the model {}", config.model.path));
        let dir = resolve_daemon_model(
            &config.model.path,
            config.model.download,
            &mut status.download_progress(),
        )?;
        status.set(format!("loading the model from {}", dir.display()));
        let b = &config.backends;
        let plugins = discover_for(
            &search_path(&b.plugin_path),
            &[&b.talker, &b.code_predictor, &b.decoder],
        );
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
                    tracing::warn!("{stage}: {w}");
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
        let t = &config.threads;
        let (talker, talker_name) = pick("talker", &b.talker, t.talker);
        let (cp, cp_name) = pick("code_predictor", &b.code_predictor, t.code_predictor);
        let (decoder, decoder_name) = match config.decoder_precision()? {
            // The fast decoder on a CPU backend of its own (its convolutions uploaded another way).
            DecoderPrecision::Fast if b.decoder == "cpu" => {
                let precision = DecoderPrecision::Fast;
                tracing::info!("decoder fast: convolutions on {}", precision.kernel());
                let backend: Arc<dyn Backend> =
                    Arc::new(precision.cpu_backend(threads_or_all(t.decoder)));
                (backend, "cpu (fast decoder)".to_owned())
            }
            precision => {
                if precision == DecoderPrecision::Fast {
                    tracing::warn!(
                        "[stream] decoder = \"fast\" applies to the cpu backend only; the decoder runs on {}",
                        b.decoder
                    );
                }
                pick("decoder", &b.decoder, t.decoder)
            }
        };
        let weights = config.weights_setting()?;
        let machine = AutoMachine::new([t.talker, t.code_predictor, t.decoder].map(threads_or_all));
        let (mut synth, auto) = load_synthesizer(
            &dir,
            LmBackends {
                talker,
                code_predictor: cp,
            },
            decoder,
            weights,
            &machine,
        )
        .with_context(|| format!("cannot load the model from {}", dir.display()))?;
        auto.iter().for_each(weights_auto::log);
        // A stage whose backend fails while speaking moves to the CPU, with these threads.
        synth.fallback.set_threads([
            threads_or_all(t.talker),
            threads_or_all(t.code_predictor),
            threads_or_all(t.decoder),
        ]);
        synth.fallback.set_log(Box::new(|stage, why| {
            tracing::warn!(
                "{}: {why}; it runs on the CPU until the next reload",
                stage.name()
            )
        }));
        let info = engine_info(
            &config.model.path,
            dir,
            &synth,
            [talker_name, cp_name, decoder_name],
            weights_auto::describe(weights, auto.as_ref()),
            start.elapsed(),
        );
        let predicted_rtf = auto.as_ref().and_then(|choice| {
            choice
                .predictions
                .iter()
                .find(|p| p.format == choice.format)
                .map(|p| p.rtf)
        });
        Ok(Engine {
            predicted_rtf,
            files: model_files(&info.model_dir),
            synth,
            info,
            key: EngineKey::of(config),
        })
    }

    /// Whether `config` needs a new engine: it changed what the engine was built from, or a stage of this one
    /// moved to the CPU after a failure (a reload tries its configured backend again).
    pub fn needs_reload(&self, config: &DaemonConfig) -> bool {
        self.key != EngineKey::of(config)
            || !self.synth.fallback.moved().is_empty()
            || self.model_files_changed()
    }

    /// Whether a weight file of the model was replaced or rewritten since the load (a package upgrade, a new
    /// download): the daemon loads it again. Until then the loaded model keeps speaking from the file it
    /// opened; a file rewritten in place makes its utterances fail with that reason rather than crash.
    pub fn model_files_changed(&self) -> bool {
        model_files(&self.info.model_dir) != self.files
    }

    /// How many stages moved to their CPU fallback since the load.
    pub fn fallbacks(&self) -> usize {
        self.synth.fallback.moved().len()
    }

    /// [`Engine::info`] with the backends running each stage now (a failed stage shows its CPU fallback).
    pub fn current_info(&self) -> EngineInfo {
        let mut info = self.info.clone();
        for stage in Stage::ALL {
            if self.synth.fallback.has_moved(stage) {
                if let Some(b) = info.backends.get_mut(stage.name()) {
                    *b = format!("cpu (fallback from {b} after a failure)");
                }
            }
        }
        info
    }

    /// A short synthesis so the first real request finds caches, pools and pages warm.
    pub fn warm_up(&self, voice: &Voice) -> Result<Duration> {
        let start = Instant::now();
        self.synthesize_unheard(voice, 4)?;
        Ok(start.elapsed())
    }

    /// Runs `voice`'s fixed prompt rows once (role, tags, speaker: see `Talker::prefill`), so its first real
    /// request prefills only its text: a one-word prompt prefilled, nothing generated or decoded.
    pub fn prepare_voice(&self, voice: &Voice) -> Result<()> {
        self.synthesize_unheard(voice, 1)
    }

    /// "Hello." in `voice`, at most `max_new_tokens` codebook-0 tokens, the audio dropped.
    fn synthesize_unheard(&self, voice: &Voice, max_new_tokens: usize) -> Result<()> {
        let options = SynthOptions {
            max_new_tokens: Some(max_new_tokens),
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
        Ok(())
    }
}

/// The language of the session's locale (`LC_ALL`, `LC_MESSAGES`, `LANG`: `de_DE.UTF-8` → `de`), which screen
/// readers and most apps send with their requests; `None` for the C/POSIX locale or none set.
pub fn locale_language() -> Option<String> {
    ["LC_ALL", "LC_MESSAGES", "LANG"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .find(|v| !v.is_empty())
        .and_then(|v| language_of_locale(&v))
}

/// `de_DE.UTF-8` → `de`, `pt_BR` → `pt`, `C.UTF-8` / `POSIX` → `None`.
fn language_of_locale(locale: &str) -> Option<String> {
    let language = locale.split(['_', '.', '@']).next()?.to_ascii_lowercase();
    (!language.is_empty() && language != "c" && language != "posix").then_some(language)
}

/// What the daemon is doing to have a model: shown as `State` = `loading` (or `failed`) and `LoadProgress`
/// while no model is loaded, and in `Speak`'s `NotReady` replies.
#[derive(Clone, Default)]
pub struct LoadStatus(Arc<Mutex<Load>>);

#[derive(Clone, Default)]
struct Load {
    /// What the load is doing now (empty when none runs).
    progress: String,
    /// Why the last load failed, until one succeeds.
    failure: Option<String>,
    /// When a failed load is tried again by itself.
    next_try: Option<std::time::Instant>,
}

impl Load {
    fn retry_note(&self) -> String {
        match self.next_try {
            Some(when) => format!(
                " (tried again in {} s)",
                when.saturating_duration_since(std::time::Instant::now())
                    .as_secs_f64()
                    .ceil()
            ),
            None => String::new(),
        }
    }
}

impl LoadStatus {
    fn lock(&self) -> std::sync::MutexGuard<'_, Load> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set(&self, progress: String) {
        self.lock().progress = progress;
    }

    /// The load ended: `Ok` clears the status, an error is kept for clients to see.
    pub fn finish(&self, result: Result<(), String>) {
        let mut load = self.lock();
        load.progress.clear();
        load.failure = result.err();
        load.next_try = None;
    }

    /// A failed load will be tried again at `when` (shown in `LoadProgress`).
    pub fn retry_at(&self, when: std::time::Instant) {
        self.lock().next_try = Some(when);
    }

    /// `LoadProgress`: what the load is doing, or why the last one failed (and when it is tried again), or
    /// empty.
    pub fn progress(&self) -> String {
        let load = self.lock();
        match (&load.failure, load.progress.is_empty()) {
            (_, false) => load.progress.clone(),
            (Some(f), true) => format!("failed: {f}{}", load.retry_note()),
            (None, true) => String::new(),
        }
    }

    /// `State` while no model is loaded: `loading`, or `failed` when the last load failed and none runs.
    pub fn state(&self) -> &'static str {
        let load = self.lock();
        if load.failure.is_some() && load.progress.is_empty() {
            "failed"
        } else {
            "loading"
        }
    }

    /// The `NotReady` message for a request that came before any model was loaded.
    pub fn not_ready(&self) -> String {
        let load = self.lock();
        match (&load.failure, load.progress.is_empty()) {
            (_, false) => format!(
                "the model is not loaded yet ({}); try again shortly",
                load.progress
            ),
            (Some(f), true) => format!(
                "the model could not be loaded: {f}{}; fix the configuration and call Reload",
                load.retry_note()
            ),
            (None, true) => "the model is not loaded yet; try again shortly".to_owned(),
        }
    }

    /// A hub progress callback that keeps this status current (and logs each file once).
    pub fn download_progress(&self) -> impl FnMut(&str, u64, Option<u64>) + '_ {
        let mut current = String::new();
        move |file: &str, done: u64, total: Option<u64>| {
            if current != file {
                current = file.to_owned();
                tracing::info!("downloading {file}");
            }
            let mb = |b: u64| b as f64 / 1e6;
            self.set(match total {
                Some(t) => format!("downloading {file}: {:.1} of {:.1} MB", mb(done), mb(t)),
                None => format!("downloading {file}: {:.1} MB", mb(done)),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::language_of_locale;

    #[test]
    fn a_locale_names_its_language() {
        assert_eq!(language_of_locale("de_DE.UTF-8").as_deref(), Some("de"));
        assert_eq!(language_of_locale("pt_BR").as_deref(), Some("pt"));
        assert_eq!(language_of_locale("sr_RS@latin").as_deref(), Some("sr"));
        assert_eq!(language_of_locale("en").as_deref(), Some("en"));
        assert_eq!(language_of_locale("C.UTF-8"), None);
        assert_eq!(language_of_locale("POSIX"), None);
        assert_eq!(language_of_locale(""), None);
    }
}
