//! `org.kazeia.Speech1` at `/org/kazeia/Speech`: Kazeia's own API, with a queue, ids and signals.

use std::collections::HashMap;
use std::sync::Arc;

use zbus::interface;
use zbus::message::Header;
use zbus::object_server::SignalEmitter;
use zbus::wire::{OwnedVariant, Variant};

use super::{peers, sender, SpeechError};
use crate::queue::shown;
use crate::request::Output;
use crate::service::{backends_summary, Service, SpeakOptions};
use crate::voices::display_name;

pub struct SpeechApi {
    pub service: Arc<Service>,
}

fn string_option(key: &str, v: &Variant<'_>) -> Result<String, SpeechError> {
    match v {
        Variant::Str(s) => Ok(s.as_str().to_owned()),
        other => Err(SpeechError::InvalidArgs(format!(
            "option `{key}` must be a string (s), not {}",
            other.value_signature()
        ))),
    }
}

fn number_option(key: &str, v: &Variant<'_>) -> Result<f32, SpeechError> {
    match v {
        Variant::F64(d) => Ok(*d as f32),
        Variant::I32(i) => Ok(*i as f32),
        Variant::U32(u) => Ok(*u as f32),
        other => Err(SpeechError::InvalidArgs(format!(
            "option `{key}` must be a number (d), not {}",
            other.value_signature()
        ))),
    }
}

/// `Speak`'s options dictionary → checked options.
pub fn parse_options(options: &HashMap<String, OwnedVariant>) -> Result<SpeakOptions, SpeechError> {
    let mut parsed = SpeakOptions::default();
    for (key, value) in options {
        let v: &Variant<'_> = value;
        // A variant wrapped in a variant (some clients do that) is looked through.
        let v = match v {
            Variant::Variant(inner) => inner.as_ref(),
            v => v,
        };
        match key.as_str() {
            "voice" => parsed.voice.speaker = Some(string_option(key, v)?),
            "language" => parsed.voice.language = Some(string_option(key, v)?),
            "instruct" => parsed.voice.instruct = Some(string_option(key, v)?),
            "rate" => parsed.prosody.rate = number_option(key, v)?,
            "pitch" => parsed.prosody.pitch = number_option(key, v)?,
            "volume" => parsed.prosody.volume = number_option(key, v)?,
            "priority" => {
                parsed.priority = string_option(key, v)?
                    .parse()
                    .map_err(SpeechError::InvalidArgs)?
            }
            "ssml" => match v {
                Variant::Bool(b) => parsed.ssml = *b,
                other => {
                    return Err(SpeechError::InvalidArgs(format!(
                        "option `ssml` must be a boolean (b), not {}",
                        other.value_signature()
                    )))
                }
            },
            other => {
                return Err(SpeechError::InvalidArgs(format!(
                    "unknown option `{}` (known: voice, language, instruct, rate, pitch, volume, priority, ssml)",
                    shown(other)
                )))
            }
        }
    }
    Ok(parsed)
}

#[interface(name = "org.kazeia.Speech1")]
impl SpeechApi {
    /// Queues `text`; returns its id. Options: voice (s), language (s), instruct (s: a style for this
    /// utterance, 1.7B CustomVoice and VoiceDesign models), rate (d, 1 = normal), pitch (d),
    /// volume (d), priority (s: important, message, text, notification, progress), ssml (b).
    async fn speak(
        &self,
        text: String,
        options: HashMap<String, OwnedVariant>,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] connection: &zbus::Connection,
    ) -> Result<u64, SpeechError> {
        let options = parse_options(&options)?;
        let client = peers::client(connection, &header).await;
        self.service.wait_ready().await;
        Ok(self
            .service
            .submit(&client, &text, options, Output::Sink)
            .await?)
    }

    /// Stops one of the caller's utterances (waiting or speaking).
    async fn stop(&self, id: u64, #[zbus(header)] header: Header<'_>) -> Result<(), SpeechError> {
        let client = sender(&header);
        let stopped = self
            .service
            .player
            .queue
            .stop_where(|r| r.id == id && r.client == client);
        if stopped == 0 {
            return Err(SpeechError::UnknownId(format!(
                "no utterance {id} of this client is waiting or speaking"
            )));
        }
        Ok(())
    }

    /// Stops every utterance of the caller; returns how many.
    async fn stop_all(&self, #[zbus(header)] header: Header<'_>) -> u32 {
        let client = sender(&header);
        self.service.player.queue.stop_where(|r| r.client == client) as u32
    }

    /// Stops every utterance of every client (a screen reader's "be quiet").
    async fn stop_everyone(&self) -> u32 {
        self.service.player.queue.stop_where(|_| true) as u32
    }

    /// Holds the caller's speech (its utterance in progress and its queued ones) until its `Resume`;
    /// other clients go on speaking. Leaving the bus ends the pause (and cancels what it held).
    async fn pause(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
    ) {
        self.service.player.pause(&sender(&header));
        let _ = self.state_changed(&emitter).await;
    }

    async fn resume(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
    ) {
        self.service.player.resume(&sender(&header));
        let _ = self.state_changed(&emitter).await;
    }

    /// Voices: (identifier, display name, languages as comma-separated BCP-47 tags).
    async fn list_voices(&self) -> Vec<(String, String, String)> {
        self.service.wait_ready().await;
        let info = self.service.info();
        let catalog = self.service.player.catalog();
        catalog
            .voices
            .iter()
            .map(|v| {
                let languages = catalog.language_tags(v, &info).join(",");
                (v.id.clone(), display_name(&v.id), languages)
            })
            .collect()
    }

    /// Reads the configuration file again and applies it; returns what changed. An invalid file is
    /// refused with the reason and the running configuration stays.
    async fn reload(
        &self,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
    ) -> Result<String, SpeechError> {
        let summary = self.service.reload().await.map_err(|e| {
            tracing::warn!("reload (D-Bus) refused, the running configuration stays: {e:#}");
            SpeechError::Failed(format!("{e:#}"))
        })?;
        tracing::info!("reload: {summary}");
        emit_properties(self, &emitter).await;
        Ok(summary)
    }

    /// `idle`, `speaking` or `paused`; before a model is loaded `loading` (see `LoadProgress`), or `failed`
    /// when it could not be (`Speak` then answers `NotReady` with the reason).
    #[zbus(property)]
    async fn state(&self) -> String {
        match self.service.player.engine() {
            Some(_) => self.service.player.state().to_owned(),
            None => self.service.loading.state().to_owned(),
        }
    }

    /// What the model's download or load is doing (`downloading model.safetensors: 12.0 of 1830.0 MB`), why
    /// the last load failed (`failed: …`), or empty.
    #[zbus(property)]
    async fn load_progress(&self) -> String {
        self.service.loading.progress()
    }

    /// Why the configuration file is not in use — unreadable, invalid or empty — or empty. The daemon then
    /// runs on the settings it last applied from that file, or on the defaults, until the file is fixed.
    #[zbus(property)]
    async fn config_problem(&self) -> String {
        self.service.config_problem()
    }

    /// Stage (`talker`, `code_predictor`, `decoder`) → backend running it.
    #[zbus(property)]
    async fn backends(&self) -> HashMap<String, String> {
        self.service.info().backends.into_iter().collect()
    }

    /// The model as configured (directory or Hugging Face repo id).
    #[zbus(property)]
    async fn model(&self) -> String {
        self.service.info().model
    }

    /// The audio sink as configured.
    #[zbus(property)]
    async fn audio_sink(&self) -> String {
        self.service.player.sink_description()
    }

    /// Utterances waiting or speaking.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn queue_length(&self) -> u32 {
        self.service.player.queue.len() as u32
    }

    #[zbus(signal)]
    pub async fn started(emitter: &SignalEmitter<'_>, id: u64) -> zbus::Result<()>;

    /// `reason`: done, stopped, cancelled, shutdown, or `error: …`.
    #[zbus(signal)]
    pub async fn finished(emitter: &SignalEmitter<'_>, id: u64, reason: &str) -> zbus::Result<()>;

    #[zbus(signal)]
    pub async fn mark(emitter: &SignalEmitter<'_>, id: u64, name: &str) -> zbus::Result<()>;
}

/// Announces the properties a reload may change.
pub async fn emit_properties(api: &SpeechApi, emitter: &SignalEmitter<'_>) {
    let _ = api.backends_changed(emitter).await;
    let _ = api.model_changed(emitter).await;
    let _ = api.audio_sink_changed(emitter).await;
    tracing::info!("backends: {}", backends_summary(&api.service.info()));
}
