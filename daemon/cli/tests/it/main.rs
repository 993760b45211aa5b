//! The `kazeia` command's integration tests, one binary: one module per command or subject.

mod bench;
mod cli_control;
mod cli_decode;
mod cli_synth;
mod install;
mod play;
mod say;
mod voices;
