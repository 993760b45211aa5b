//! `sd_kazeia`, the speech-dispatcher output module: speech-dispatcher starts it as a child and talks the
//! module protocol on its stdin/stdout (`docs/linux-speech-stack.md` §1); the module forwards each message to
//! kazeiad's Spiel provider over the session bus and relays the audio back as server audio (`705` blocks)
//! with index marks (`700`). The model lives only in the daemon.
//!
//! - [`protocol`]: input lines → [`protocol::Command`]s (blocks, dot-unstuffing, error replies).
//! - [`output`]: replies and events, one lock per block; [`server_audio`]: the `705` encoder.
//! - [`module`]: the command loop; [`speaker`]: one message's audio and events on its own thread.
//! - [`settings`]: SET keys and their Spiel mapping; [`keys`]: words for CHAR and KEY.
//! - [`synth`]: what the module needs from a synthesiser; [`dbus_client`]: kazeiad's provider.
//! - [`config`]: the module's config file; [`log`]: stderr logging.

pub mod config;
pub mod dbus_client;
pub mod keys;
pub mod log;
pub mod module;
pub mod output;
pub mod protocol;
#[cfg(test)]
mod random_input;
pub mod server_audio;
pub mod settings;
pub mod speaker;
pub mod synth;

pub use module::{run, ModuleOptions};
