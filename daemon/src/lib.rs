//! The Kazeia daemon's parts, shared by the `kazeia` command line, the daemon (`kazeia daemon` / `kazeiad`)
//! and the speech-dispatcher module `sd_kazeia`.
//!
//! - [`audio`]: where speech is played (PipeWire, a WAV file, nowhere).
//! - [`spiel_stream`]: the Spiel provider stream format (`audio/x-spiel`) on a pipe.
//! - [`speechd`]: the speech-dispatcher output module protocol.

pub mod audio;
pub mod speechd;
pub mod spiel_stream;
