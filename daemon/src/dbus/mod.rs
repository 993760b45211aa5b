//! The daemon on the session bus: Kazeia's own API (`org.kazeia.Speech1`) and the Spiel provider
//! (`org.freedesktop.Speech.Provider`), served by one connection that owns both names.

pub mod api;
pub mod client;
pub mod peers;
pub mod spiel;

use std::sync::Arc;

use futures_util::StreamExt;

use crate::service::{Refusal, Service};

pub const BUS_NAME: &str = "org.kazeia.Speech";
pub const OBJECT_PATH: &str = "/org/kazeia/Speech";
pub const INTERFACE: &str = "org.kazeia.Speech1";
pub const SPIEL_BUS_NAME: &str = "org.kazeia.Speech.Provider";
/// Spiel derives the object path from the bus name.
pub const SPIEL_OBJECT_PATH: &str = "/org/kazeia/Speech/Provider";

/// Error replies of both interfaces (`org.kazeia.Speech1.Error.*`).
#[derive(Debug, zbus::DBusError)]
#[zbus(prefix = "org.kazeia.Speech1.Error")]
pub enum SpeechError {
    /// An argument or option is missing, of the wrong type or out of range.
    InvalidArgs(String),
    /// The SSML text is malformed.
    InvalidSsml(String),
    /// The voice or language is not one the model has.
    UnknownVoice(String),
    /// The text is longer than the configured limit.
    TextTooLong(String),
    /// The queue holds as many utterances as configured.
    QueueFull(String),
    /// No utterance of this client has that id.
    UnknownId(String),
    /// The model is loading or the daemon is stopping.
    NotReady(String),
    /// The operation failed; the message says why.
    Failed(String),
    #[zbus(error)]
    ZBus(zbus::Error),
}

impl From<Refusal> for SpeechError {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::InvalidArgs(m) => SpeechError::InvalidArgs(m),
            Refusal::InvalidSsml(m) => SpeechError::InvalidSsml(m),
            Refusal::UnknownVoice(m) => SpeechError::UnknownVoice(m),
            Refusal::TextTooLong(m) => SpeechError::TextTooLong(m),
            Refusal::QueueFull(m) => SpeechError::QueueFull(m),
            Refusal::NotReady(m) => SpeechError::NotReady(m),
        }
    }
}

/// The sender of a method call, the client identity used for per-client stop.
pub fn sender(header: &zbus::message::Header<'_>) -> String {
    header
        .sender()
        .map_or_else(|| "unknown".to_owned(), |s| s.to_string())
}

/// Releases what each client owns (pause, held utterances, streams) when it leaves the bus: its unique
/// name loses its owner (`NameOwnerChanged`).
pub async fn watch_clients(
    connection: &zbus::Connection,
    service: Arc<Service>,
) -> zbus::Result<()> {
    let bus = zbus::fdo::DBusProxy::new(connection).await?;
    let mut changes = bus.receive_name_owner_changed().await?;
    tokio::spawn(async move {
        while let Some(signal) = changes.next().await {
            let Ok(args) = signal.args() else { continue };
            let name = args.name().as_str();
            if name.starts_with(':') && args.new_owner().is_none() {
                service.client_left(name);
                peers::forget(name);
            }
        }
    });
    Ok(())
}
