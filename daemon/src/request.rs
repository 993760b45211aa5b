//! One utterance as the adapters hand it to the queue: parsed text, voice, prosody, where the audio goes.

use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::Instant;

use kazeia_text::ssml::Piece;

use crate::queue::{Id, Priority};

/// Where an utterance's audio goes.
#[derive(Debug)]
pub enum Output {
    /// The daemon's audio sink (PipeWire, WAV file, null).
    Sink,
    /// A Spiel client's pipe, as an `audio/x-spiel` stream.
    Spiel(File),
}

/// A voice chosen by a request; `None` fields take the configured default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VoiceChoice {
    pub speaker: Option<String>,
    pub language: Option<String>,
    /// A style instruction for this request (1.7B CustomVoice and VoiceDesign models).
    pub instruct: Option<String>,
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
    /// The D-Bus unique name of the client that asked.
    pub client: String,
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
        client: &str,
        priority: Priority,
        pieces: Vec<Piece>,
        voice: VoiceChoice,
        prosody: RequestProsody,
        output: Output,
    ) -> Self {
        Request {
            id,
            client: client.to_owned(),
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
            client,
            priority,
            Vec::new(),
            VoiceChoice::default(),
            RequestProsody::default(),
            Output::Sink,
        )
    }
}
