//! Kazeia's text and markup, apart from the model: what a client's text and SSML ask for, with no model,
//! backend or bus behind it, so the speech-dispatcher module (`sd_kazeia`) and the fuzz targets use it alone.
//!
//! - [`ssml`]: SSML → text runs with their prosody, index marks and bounded pauses.
//! - [`text`]: long text cut into sentence-sized chunks (ranges of the text) for synthesis.
//! - [`prosody_filter`]: the streaming rate / pitch / volume filter that applies an SSML prosody to audio.

pub mod prosody_filter;
pub mod ssml;
pub mod text;
