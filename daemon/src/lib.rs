//! `kazeiad`, the Kazeia speech daemon: a resident model served to every client of the session. The `kazeia`
//! command line (`daemon/cli/`) runs it as `kazeia daemon` and uses its configuration, engine and voice store;
//! the speech-dispatcher module `sd_kazeia` is its own crate (`kazeia-speechd`, `daemon/speechd-module/`), and
//! the Spiel stream format is `kazeia-spiel` (`daemon/spiel/`).
//!
//! - [`config`]: the configuration file, `kazeia.toml`; [`last_good`]: the settings last applied from it.
//! - [`engine`]: the resident model on its configured backends; [`voices`]: what clients may ask for.
//! - [`request`], [`queue`]: utterances and the priority queue; [`player`]: the worker that speaks them,
//!   with [`short_cache`] for instant repeats of short texts, and [`memory`] returning freed memory to the
//!   system when the queue has been quiet.
//! - [`service`]: request checks and live reconfiguration, behind [`dbus`] (Kazeia's API and Spiel).
//! - [`daemon_cmd`]: the daemon's main loop (signals, reload, bus lifetime).
//! - [`voice_store`]: voices a user makes and keeps (written by `kazeia voice …`, watched by the daemon).
//! - [`audio`]: where speech is played (PipeWire, a WAV file, nowhere).

pub mod audio;
pub mod config;
pub mod daemon_cmd;
pub mod dbus;
pub mod engine;
pub mod last_good;
pub mod logging;
pub mod memory;
pub mod model_path;
pub mod player;
pub mod progress;
pub mod queue;
pub mod request;
pub mod runs;
pub mod service;
pub mod short_cache;
pub mod voice_store;
pub mod voices;
