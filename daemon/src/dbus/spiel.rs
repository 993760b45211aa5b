//! `org.freedesktop.Speech.Provider` (Spiel) at `/org/kazeia/Speech/Provider`: the client passes a pipe (or
//! a stream socket; anything else is refused, see `kazeia_spiel::ClientFd`), the daemon streams
//! `audio/x-spiel` into it as the audio is generated, with a MARK event at each SSML `<mark>`, and closes it
//! at the end. A client closing its end cancels; one reading slower than real time loses its stream to
//! clients that wait (see `queue.rs`).

use std::sync::Arc;

use kazeia_spiel::ClientFd;
use zbus::interface;
use zbus::message::Header;

use super::{peers, SpeechError};
use crate::queue::Priority;
use crate::request::{Output, RequestProsody, VoiceChoice};
use crate::service::{Service, SpeakOptions};
use crate::voices::{display_name, model_language};

/// Spiel voice features this provider honours.
const EVENTS_SSML_MARK: u64 = 0x8;
const SSML_SAY_AS_CHARACTERS: u64 = 0x80;
const SSML_BREAK: u64 = 0x1000;
const SSML_SUB: u64 = 0x2000;
const SSML_PROSODY: u64 = 0x10000;
pub const VOICE_FEATURES: u64 =
    EVENTS_SSML_MARK | SSML_SAY_AS_CHARACTERS | SSML_BREAK | SSML_SUB | SSML_PROSODY;

pub struct SpielProvider {
    pub service: Arc<Service>,
}

/// The caps string of the stream the provider writes.
pub fn output_format(sample_rate: u32) -> String {
    format!("audio/x-spiel,format=S16LE,channels=1,rate={sample_rate}")
}

/// Whether a Spiel text holds nothing the model would say; malformed SSML is left to the service to refuse.
fn nothing_to_say(text: &str, is_ssml: bool) -> bool {
    let pieces = if is_ssml {
        match kazeia_text::ssml::parse_ssml(text) {
            Ok(pieces) => pieces,
            Err(_) => return false,
        }
    } else {
        kazeia_text::ssml::plain_text(text)
    };
    !kazeia_text::ssml::has_speech(&pieces)
        && !pieces
            .iter()
            .any(|p| matches!(p, kazeia_text::ssml::Piece::Mark(_)))
}

impl SpielProvider {
    /// The request's language if the model speaks it; else none (the voice's own, the model's `auto`),
    /// logged once per language: a screen reader reading a foreign phrase must not fall silent.
    fn spoken_language(&self, language: String) -> Option<String> {
        if language.is_empty() {
            return None;
        }
        // Longer than any language tag: kept, for the request's checks to refuse with the reason.
        if language.len() > crate::request::MAX_LANGUAGE_BYTES {
            return Some(language);
        }
        let info = self.service.info();
        if info.languages.is_empty() || model_language(&language, &info).is_ok() {
            return Some(language);
        }
        static LOGGED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
        let mut logged = LOGGED.lock().unwrap_or_else(|e| e.into_inner());
        if !logged.contains(&language) {
            tracing::info!("Spiel: the model does not speak `{language}`; such requests use auto");
            logged.push(language);
        }
        None
    }
}

#[interface(name = "org.freedesktop.Speech.Provider")]
impl SpielProvider {
    /// Queues `text` for the pipe `pipe_fd`; returns at once, the audio follows on the pipe.
    #[allow(clippy::too_many_arguments)]
    async fn synthesize(
        &self,
        pipe_fd: zbus::OwnedFd,
        text: String,
        voice_id: String,
        pitch: f64,
        rate: f64,
        is_ssml: bool,
        language: String,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] connection: &zbus::Connection,
    ) -> Result<(), SpeechError> {
        // A pipe or stream socket only, written through a file description of the daemon's own.
        let fd =
            ClientFd::new(pipe_fd.into()).map_err(|e| SpeechError::InvalidArgs(e.to_string()))?;
        // Nothing the model would say (markup, marks or punctuation alone): the stream ends at once, as an
        // utterance that is over, rather than an error a screen reader would have to handle.
        if nothing_to_say(&text, is_ssml) {
            return Ok(());
        }
        let client = peers::client(connection, &header).await;
        let options = SpeakOptions {
            voice: VoiceChoice {
                speaker: Some(voice_id).filter(|v| !v.is_empty()),
                language: self.spoken_language(language),
                instruct: None,
            },
            prosody: RequestProsody {
                rate: rate as f32,
                pitch: pitch as f32,
                volume: 1.0,
            },
            // Spiel clients keep their own order; theirs is what the user is waiting for now.
            priority: Priority::Message,
            ssml: is_ssml,
        };
        self.service.wait_ready().await;
        self.service
            .submit(&client, &text, options, Output::Spiel(fd))
            .await?;
        Ok(())
    }

    /// (name, identifier, output format, features, languages).
    #[zbus(property)]
    async fn voices(&self) -> Vec<(String, String, String, u64, Vec<String>)> {
        let info = self.service.info();
        let catalog = self.service.player.catalog();
        let format = output_format(info.sample_rate);
        catalog
            .voices
            .iter()
            .map(|v| {
                (
                    display_name(&v.id),
                    v.id.clone(),
                    format.clone(),
                    VOICE_FEATURES,
                    catalog.language_tags(v, &info),
                )
            })
            .collect()
    }

    #[zbus(property)]
    async fn name(&self) -> String {
        "Kazeia".into()
    }
}
