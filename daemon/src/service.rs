//! What every adapter (Kazeia's D-Bus API, the Spiel provider) calls: checking and queueing requests, and
//! applying a new configuration without a restart.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{Context, Result};
use kazeia_engine::synth::Voice;
use kazeia_text::ssml::{has_speech, parse_ssml, plain_text, Piece};
use kazeia_text::text::{split_for_synthesis, DEFAULT_CHUNK_CHARS};

use crate::config::DaemonConfig;
use crate::engine::{Engine, EngineInfo, LoadStatus};
use crate::player::Player;
use crate::queue::{Id, Priority, QueueError};
use crate::request::{Client, Output, Request, RequestProsody, VoiceChoice};
use crate::voice_store;
use crate::voices::{check_instruct, resolve_voice, speech_voice, Catalog};

/// A request's options, from `Speak`'s `a{sv}` or Spiel's arguments.
#[derive(Clone, Debug)]
pub struct SpeakOptions {
    pub voice: VoiceChoice,
    pub prosody: RequestProsody,
    pub priority: Priority,
    pub ssml: bool,
}

impl Default for SpeakOptions {
    fn default() -> Self {
        SpeakOptions {
            voice: VoiceChoice::default(),
            prosody: RequestProsody::default(),
            priority: Priority::Text,
            ssml: false,
        }
    }
}

/// Why a request was refused.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("{0}")]
    InvalidArgs(String),
    #[error("{0}")]
    InvalidSsml(String),
    #[error("{0}")]
    UnknownVoice(String),
    #[error("{0}")]
    TextTooLong(String),
    #[error("{0}")]
    QueueFull(String),
    #[error("{0}")]
    NotReady(String),
}

/// How long a request waits for the first model before `NotReady` (well under D-Bus's 25 s call timeout).
pub const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

pub struct Service {
    pub player: Arc<Player>,
    next_id: AtomicU64,
    /// `--config`, if given; otherwise the usual places are searched again at each reload.
    explicit_config: Option<PathBuf>,
    /// One load at a time: the first load holds it too, so a reload asked meanwhile waits for it.
    reloading: Arc<tokio::sync::Mutex<()>>,
    /// Reloads asked for, and the count when the newest one started: a reload asked before another started
    /// is covered by it (that one read the file later), so reloads asked during a load run once, not once
    /// each.
    reloads_asked: AtomicU64,
    reloads_started: AtomicU64,
    last_reload: Mutex<Option<Result<String, String>>>,
    /// How the model's download and load go (what clients see before one is loaded).
    pub loading: LoadStatus,
    /// Why the configuration file is not in use (unreadable, invalid, empty), or empty: `ConfigProblem`.
    config_problem: Mutex<String>,
}

impl Service {
    pub fn new(player: Arc<Player>, explicit_config: Option<PathBuf>) -> Self {
        Service {
            player,
            next_id: AtomicU64::new(1),
            explicit_config,
            reloading: Arc::new(tokio::sync::Mutex::new(())),
            reloads_asked: AtomicU64::new(0),
            reloads_started: AtomicU64::new(0),
            last_reload: Mutex::new(None),
            loading: LoadStatus::default(),
            config_problem: Mutex::new(String::new()),
        }
    }

    /// Why the configuration file is not in use, or empty.
    pub fn config_problem(&self) -> String {
        lock(&self.config_problem).clone()
    }

    pub fn set_config_problem(&self, problem: String) {
        *lock(&self.config_problem) = problem;
    }

    /// The load lock, taken before the first load is spawned so that no reload can run before it.
    pub async fn hold_loads(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.reloading.clone().lock_owned().await
    }

    pub fn info(&self) -> EngineInfo {
        self.player
            .engine()
            .map(|e| e.current_info())
            .unwrap_or_default()
    }

    /// Waits (at most [`READY_WAIT`]) while the first model loads, so that a client that started the daemon
    /// by activation is served rather than refused; returns at once when a model is loaded or the load failed.
    pub async fn wait_ready(&self) {
        let deadline = tokio::time::Instant::now() + READY_WAIT;
        while self.player.engine().is_none()
            && self.loading.state() == "loading"
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Checks and queues an utterance; returns its id.
    pub async fn submit(
        &self,
        client: &Client,
        text: &str,
        options: SpeakOptions,
        output: Output,
    ) -> Result<Id, Refusal> {
        let config = self.player.config();
        if text.len() > config.queue.max_text_bytes {
            return Err(Refusal::TextTooLong(format!(
                "the text is {} bytes long; the limit is {} ([queue] max_text_bytes)",
                text.len(),
                config.queue.max_text_bytes
            )));
        }
        options
            .voice
            .check_lengths()
            .map_err(Refusal::InvalidArgs)?;
        let pieces = parse_text(text.to_owned(), options.ssml).await?;
        if !has_speech(&pieces) && !pieces.iter().any(|p| matches!(p, Piece::Mark(_))) {
            return Err(Refusal::InvalidArgs(
                "the text is empty: nothing to say".into(),
            ));
        }
        let engine = self
            .player
            .engine()
            .ok_or_else(|| Refusal::NotReady(self.loading.not_ready()))?;
        check_instruct(&options.voice, &engine.info)
            .map_err(|e| Refusal::InvalidArgs(e.to_string()))?;
        resolve_voice(
            &options.voice,
            &config.voice,
            &engine.info,
            &self.player.catalog(),
        )
        .map_err(|e| Refusal::UnknownVoice(e.to_string()))?;
        let prosody = check_prosody(options.prosody)?;
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let request = Request::new(
            id,
            client,
            options.priority,
            pieces,
            options.voice,
            prosody,
            output,
        );
        self.player.queue.push(request).map_err(|e| match e {
            QueueError::Full(_) => Refusal::QueueFull(e.to_string()),
            QueueError::Closed => Refusal::NotReady(e.to_string()),
        })?;
        Ok(id)
    }

    /// A client left the bus: what it owns is released (see [`crate::queue::SpeechQueue::client_left`]).
    pub fn client_left(&self, client: &str) {
        self.player.queue.client_left(client);
    }

    /// Reads the configuration file again and applies it: a new model or backends are loaded beside the
    /// running ones and swapped in between utterances; an invalid or empty file changes nothing. Loads run
    /// one at a time; a reload asked while another waits is answered by that one.
    pub async fn reload(&self) -> Result<String> {
        let asked = self.reloads_asked.fetch_add(1, Ordering::SeqCst) + 1;
        let _one = self.reloading.lock().await;
        if self.reloads_started.load(Ordering::SeqCst) >= asked {
            return match lock(&self.last_reload).clone() {
                Some(Ok(summary)) => Ok(summary),
                Some(Err(e)) => Err(anyhow::anyhow!(e)),
                None => Ok("no change".into()),
            };
        }
        self.reloads_started
            .store(self.reloads_asked.load(Ordering::SeqCst), Ordering::SeqCst);
        let result = self.read_and_apply().await;
        *lock(&self.last_reload) = Some(match &result {
            Ok(summary) => Ok(summary.clone()),
            Err(e) => Err(format!("{e:#}")),
        });
        result
    }

    async fn read_and_apply(&self) -> Result<String> {
        let file = crate::config::config_path(self.explicit_config.as_deref());
        let Some(path) = file else {
            self.set_config_problem(String::new());
            return self.apply(DaemonConfig::default()).await;
        };
        let (config, text) = match crate::config::read_file(&path) {
            Ok(read) => read,
            Err(e) => {
                self.set_config_problem(format!("{e:#}"));
                return Err(e);
            }
        };
        self.set_config_problem(String::new());
        let applied = self.apply(config).await?;
        crate::last_good::save(&path, &text);
        Ok(applied)
    }

    /// Applies a configuration; returns a summary of what changed.
    pub async fn apply(&self, config: DaemonConfig) -> Result<String> {
        // Validated with the configuration; RUST_LOG, when set, keeps its say.
        let _ = crate::logging::set_level(&config.log.level);
        let running = self.player.config();
        let mut changes = Vec::new();
        let needs_engine = self.player.engine().is_none_or(|e| e.needs_reload(&config));
        if needs_engine {
            let cfg = config.clone();
            let loading = self.loading.clone();
            let loaded = tokio::task::spawn_blocking(move || -> Result<_> {
                let engine = Engine::load_with(&cfg, &loading)?;
                let catalog = voice_catalog(&engine.info, &cfg);
                let voice = speech_voice(&VoiceChoice::default(), &cfg, &engine.info, &catalog)?;
                loading.set("warming up".into());
                engine.warm_up(&voice).context("warm-up synthesis failed")?;
                prepare_locale_voice(&engine, &cfg, &catalog, &voice);
                prepare_clones(&engine, &catalog);
                Ok((engine, catalog))
            })
            .await
            .context("model loading panicked")
            .and_then(|r| r);
            self.loading
                .finish(loaded.as_ref().map(|_| ()).map_err(|e| format!("{e:#}")));
            let (engine, catalog) = loaded?;
            changes.push(format!(
                "model {} on {} (loaded in {:.1} s)",
                engine.info.model,
                backends_summary(&engine.info),
                engine.info.load_time.as_secs_f64()
            ));
            self.player.set_engine(Arc::new(engine), Arc::new(catalog));
        } else if let Some(engine) = self.player.engine() {
            // Voice defaults are checked against the running model before they are taken.
            let mut catalog = voice_catalog(&engine.info, &config);
            catalog.keep_prepared(&self.player.catalog());
            resolve_voice(
                &VoiceChoice::default(),
                &config.voice,
                &engine.info,
                &catalog,
            )
            .context("[voice]")?;
            if config.voices != running.voices {
                changes.push("voices".into());
            }
            self.player.set_catalog(Arc::new(catalog));
        }
        let spec = config.sink()?;
        let changed = config != running;
        let new_sink = config.audio.sink != running.audio.sink;
        // Utterances from here on take the new settings with the new engine, also while the sink opens (which
        // can take a while when the audio server does not answer).
        self.player.set_config(config);
        if new_sink || self.player.sink_description() == "none" {
            let (player, opening) = (self.player.clone(), spec.clone());
            // An utterance may have opened the same sink meanwhile: it is kept, not opened twice.
            let opened = tokio::task::spawn_blocking(move || player.use_sink(&opening))
                .await
                .context("opening the audio sink panicked")?;
            match opened {
                Ok(sink) => changes.push(format!("audio sink {}", sink.describe())),
                // The audio server may not run yet (the daemon can start first at login): Spiel clients are
                // served meanwhile, and each utterance for the sink tries again.
                Err(e) => {
                    tracing::warn!("audio sink {spec}: {e:#}; will retry when speaking");
                    changes.push(format!("audio sink {spec} (not open yet)"));
                }
            }
        }
        if changed && changes.is_empty() {
            changes.push("settings".into());
        }
        Ok(if changes.is_empty() {
            "no change".into()
        } else {
            format!("applied: {}", changes.join("; "))
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The text as pieces, parsed and split on tokio's blocking pool: the work is linear in the text, but a
/// megabyte of it is milliseconds that the executor's few threads owe to other clients' `Stop`s.
async fn parse_text(text: String, ssml: bool) -> Result<Vec<Piece>, Refusal> {
    let parsed = tokio::task::spawn_blocking(move || {
        let pieces = if ssml {
            parse_ssml(&text).map_err(|e| Refusal::InvalidSsml(e.to_string()))?
        } else {
            plain_text(&text)
        };
        Ok(split_long_pieces(pieces))
    })
    .await;
    parsed.unwrap_or_else(|e| {
        Err(Refusal::InvalidArgs(format!(
            "the text could not be read (internal error: {e})"
        )))
    })
}

impl Service {
    /// Reads the voice store again (a voice was added, removed or renamed); whether the voices changed.
    pub fn refresh_voices(&self) -> bool {
        let Some(engine) = self.player.engine() else {
            return false;
        };
        let mut catalog = voice_catalog(&engine.info, &self.player.config());
        let old = self.player.catalog();
        catalog.keep_prepared(&old);
        let ids = |c: &Catalog| -> Vec<String> { c.voices.iter().map(|v| v.id.clone()).collect() };
        let changed = ids(&old) != ids(&catalog) || old.unavailable != catalog.unavailable;
        let catalog = Arc::new(catalog);
        self.player.set_catalog(catalog.clone());
        // New cloned voices get their reference decoded now rather than at their first utterance.
        std::thread::spawn(move || prepare_clones(&engine, &catalog));
        changed
    }
}

/// Clients usually send the session's language (Orca does): the default voice in that language gets its
/// fixed prompt rows run too, when it differs from the warmed-up one.
fn prepare_locale_voice(engine: &Engine, config: &DaemonConfig, catalog: &Catalog, warm: &Voice) {
    let Some(language) = crate::engine::locale_language() else {
        return;
    };
    let choice = VoiceChoice {
        language: Some(language),
        ..VoiceChoice::default()
    };
    // A language the model does not speak is the client's to hear about, not the warm-up's.
    let Ok(voice) = speech_voice(&choice, config, &engine.info, catalog) else {
        return;
    };
    if voice.language != warm.language {
        if let Err(e) = engine.prepare_voice(&voice) {
            tracing::warn!(
                "cannot prepare the default voice in {}: {e:#}",
                voice.language
            );
        }
    }
}

/// Decodes the reference of each cloned voice not prepared yet (once per voice).
fn prepare_clones(engine: &Engine, catalog: &Catalog) {
    for clone in catalog.clone_prompts() {
        if let Err(e) = engine.synth.prepare_clone(&clone) {
            tracing::warn!("voices: cannot prepare a cloned voice: {e:#}");
        }
    }
}

/// The voices of an engine under a configuration, problems logged.
pub fn voice_catalog(info: &EngineInfo, config: &DaemonConfig) -> Catalog {
    let (stored, problems) = match voice_store::voices_dir() {
        Ok(dir) => voice_store::list(&dir),
        Err(e) => (Vec::new(), vec![format!("{e:#}")]),
    };
    let catalog = Catalog::build(info, &config.voices, &stored);
    for line in problems.iter().chain(&catalog.notes) {
        tracing::warn!("voices: {line}");
    }
    for (name, why) in &catalog.unavailable {
        tracing::warn!("voices: `{name}` not offered: {why}");
    }
    catalog
}

/// Long text pieces cut into the chunks the engine would speak one after the other anyway (a few
/// sentences each): an interrupted utterance then resumes at the first chunk not yet heard.
fn split_long_pieces(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out = Vec::with_capacity(pieces.len());
    for piece in pieces {
        match piece {
            Piece::Text { text, prosody } if text.chars().count() > DEFAULT_CHUNK_CHARS => {
                for chunk in split_for_synthesis(&text, DEFAULT_CHUNK_CHARS) {
                    out.push(Piece::Text {
                        text: chunk,
                        prosody,
                    });
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// `talker=cpu, code_predictor=cpu, decoder=vulkan`.
pub fn backends_summary(info: &EngineInfo) -> String {
    info.backends
        .iter()
        .map(|(stage, b)| format!("{stage}={b}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn check_prosody(p: RequestProsody) -> Result<RequestProsody, Refusal> {
    let check = |name: &str, v: f32, min: f32, max: f32| {
        if !v.is_finite() || v < min || v > max {
            Err(Refusal::InvalidArgs(format!(
                "{name} {v} is out of range ({min} to {max}; 1 = normal)"
            )))
        } else {
            Ok(v)
        }
    };
    Ok(RequestProsody {
        rate: check("rate", p.rate, 0.1, 10.0)?,
        pitch: check("pitch", p.pitch, 0.0, 2.0)?.max(0.5),
        volume: check("volume", p.volume, 0.0, 4.0)?,
    })
}
