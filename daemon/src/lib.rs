//! The Kazeia daemon's parts, shared by the `kazeia` command line and the daemon (`kazeiad`, also
//! `kazeia daemon`). The speech-dispatcher module `sd_kazeia` is its own crate (`kazeia-speechd`,
//! `daemon/speechd-module/`), and the Spiel stream format is `kazeia-spiel` (`daemon/spiel/`).
//!
//! - [`config`]: the configuration file, `kazeia.toml`.
//! - [`engine`]: the resident model on its configured backends; [`voices`]: what clients may ask for.
//! - [`request`], [`queue`]: utterances and the priority queue; [`player`]: the worker that speaks them,
//!   with [`short_cache`] for instant repeats of short texts.
//! - [`service`]: request checks and live reconfiguration, behind [`dbus`] (Kazeia's API and Spiel).
//! - [`daemon_cmd`]: the daemon's main loop (signals, reload, bus lifetime); [`say_cmd`], [`install_cmd`]:
//!   `kazeia say` and `kazeia install`; [`control_cmd`]: `kazeia voices`, `status`, `stop`.
//! - [`voice_store`], [`voice_cmd`]: voices a user makes and keeps (`kazeia voice …`).
//! - [`audio`]: where speech is played (PipeWire, a WAV file, nowhere).

pub mod audio;
pub mod config;
pub mod control_cmd;
pub mod daemon_cmd;
pub mod dbus;
pub mod engine;
pub mod install_cmd;
pub mod logging;
pub mod model_path;
pub mod play_cmd;
pub mod player;
pub mod progress;
pub mod queue;
pub mod request;
pub mod runs;
pub mod say_cmd;
pub mod service;
pub mod short_cache;
pub mod voice_add;
pub mod voice_cmd;
pub mod voice_store;
pub mod voices;
