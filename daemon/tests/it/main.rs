//! The daemon's integration tests, one binary: real dbus-daemon, PipeWire, speech-dispatcher and Orca,
//! one module per subject, `common` the harness they share. `audio_sinks` is its own binary: it sets the
//! process's environment, which every daemon a test starts would inherit.

mod common;

mod backend_faults;
mod bounded_requests;
mod client_fds;
mod clients;
mod daemon_audio;
mod daemon_dbus;
mod fair_share;
mod first_start;
mod logging;
mod orca;
mod speechd_module;
mod weights_auto;
