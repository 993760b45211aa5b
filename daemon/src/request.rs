//! One utterance as the adapters hand it to the queue: parsed text, voice, prosody, where the audio goes.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::Instant;

use kazeia_spiel::ClientFd;
use kazeia_text::ssml::Piece;

use crate::queue::{Id, Priority};

/// Where an utterance's audio goes.
#[derive(Debug)]
pub enum Output {
    /// The daemon's audio sink (PipeWire, WAV file, null).
    Sink,
    /// A Spiel client's pipe (or stream socket), as an `audio/x-spiel` stream.
    Spiel(ClientFd),
}

/// Who asked. Stop, pause and the order of a client's streams belong to its D-Bus connection; limits and
/// fairness belong to the client behind it, its process: an app cannot buy more of the daemon by opening
/// more connections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Client {
    /// The connection's unique name (`:1.42`).
    pub connection: String,
    /// The process behind it (`pid 1234`), or the connection itself when the bus does not say.
    pub owner: String,
}

impl Client {
    /// A client that is its own owner (in-process callers, buses that do not tell the process).
    pub fn alone(connection: &str) -> Self {
        Client {
            connection: connection.to_owned(),
            owner: connection.to_owned(),
        }
    }
}

/// A voice chosen by a request; `None` fields take the configured default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VoiceChoice {
    pub speaker: Option<String>,
    pub language: Option<String>,
    /// A style instruction for this request (1.7B CustomVoice and VoiceDesign models).
    pub instruct: Option<String>,
}

/// Longest voice name accepted, in bytes (built-in speakers and stored voices are short words).
pub const MAX_VOICE_BYTES: usize = 256;
/// Longest language tag accepted, in bytes (BCP-47 tags in use are under 20; the grammar allows ~35).
pub const MAX_LANGUAGE_BYTES: usize = 64;
/// Longest style instruction accepted, in bytes: a few sentences. Every byte enters the talker's prompt,
/// whose rows cost keys and values (~230 KB a token on the released models) in each generation and in the
/// kept prompt prefixes.
pub const MAX_INSTRUCT_BYTES: usize = 1024;

impl VoiceChoice {
    /// Every string of the choice within its bound; the error names the field and the bound.
    pub fn check_lengths(&self) -> Result<(), String> {
        for (field, value, max) in [
            ("voice", &self.speaker, MAX_VOICE_BYTES),
            ("language", &self.language, MAX_LANGUAGE_BYTES),
            ("instruct", &self.instruct, MAX_INSTRUCT_BYTES),
        ] {
            if let Some(v) = value.as_deref().filter(|v| v.len() > max) {
                return Err(format!(
                    "`{field}` is {} bytes long; the limit is {max}",
                    v.len()
                ));
            }
        }
        Ok(())
    }
}

/// Rate, pitch and volume multipliers of a whole request (1.0 = as synthesized).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RequestProsody {
    pub rate: f32,
    pub pitch: f32,
    pub volume: f32,
}

impl Default for RequestProsody {
    fn default() -> Self {
        RequestProsody {
            rate: 1.0,
            pitch: 1.0,
            volume: 1.0,
        }
    }
}

#[derive(Debug)]
pub struct Request {
    pub id: Id,
    /// The D-Bus unique name of the connection that asked (stop, pause, order of its streams).
    pub client: String,
    /// The client behind that connection, its process (limits, fairness): see [`Client`].
    pub owner: String,
    pub priority: Priority,
    /// The text as parsed: text pieces, marks, breaks.
    pub pieces: Vec<Piece>,
    pub voice: VoiceChoice,
    pub prosody: RequestProsody,
    pub output: Output,
    /// `Started` was signalled (an utterance interrupted by a higher priority is played again later).
    pub started: AtomicBool,
    /// The first piece to speak: after an interruption, the pieces already heard are not said again.
    pub resume_from: AtomicUsize,
    /// When the adapter handed it over: the origin of the latency figures in the debug log.
    pub received: Instant,
}

impl Request {
    pub fn new(
        id: Id,
        client: &Client,
        priority: Priority,
        pieces: Vec<Piece>,
        voice: VoiceChoice,
        prosody: RequestProsody,
        output: Output,
    ) -> Self {
        Request {
            id,
            client: client.connection.clone(),
            owner: client.owner.clone(),
            priority,
            pieces,
            voice,
            prosody,
            output,
            started: AtomicBool::new(false),
            resume_from: AtomicUsize::new(0),
            received: Instant::now(),
        }
    }

    #[cfg(test)]
    pub fn test(id: Id, client: &str, priority: Priority) -> Self {
        Self::new(
            id,
            &Client::alone(client),
            priority,
            Vec::new(),
            VoiceChoice::default(),
            RequestProsody::default(),
            Output::Sink,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn voice_strings_are_bounded() {
        let ok = VoiceChoice {
            speaker: Some("Vivian".into()),
            language: Some("en-US".into()),
            instruct: Some("Calm and warm.".into()),
        };
        assert_eq!(ok.check_lengths(), Ok(()));
        let long = |n| Some("x".repeat(n));
        for (choice, field) in [
            (
                VoiceChoice {
                    speaker: long(MAX_VOICE_BYTES + 1),
                    ..ok.clone()
                },
                "voice",
            ),
            (
                VoiceChoice {
                    language: long(MAX_LANGUAGE_BYTES + 1),
                    ..ok.clone()
                },
                "language",
            ),
            (
                VoiceChoice {
                    instruct: long(MAX_INSTRUCT_BYTES + 1),
                    ..ok.clone()
                },
                "instruct",
            ),
        ] {
            let e = choice.check_lengths().unwrap_err();
            assert!(e.contains(field) && e.contains("limit"), "{e}");
        }
        let at_limit = VoiceChoice {
            instruct: long(MAX_INSTRUCT_BYTES),
            ..ok
        };
        assert_eq!(at_limit.check_lengths(), Ok(()));
    }
}
