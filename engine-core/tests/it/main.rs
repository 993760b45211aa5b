//! The engine's integration tests, one binary (as ripgrep's `tests/tests.rs`): one module per subject,
//! `common` the fixtures they share. `fallback` is its own binary: it sets the process's environment.

mod common;

mod batch_generate;
mod client_text;
mod codec_fast;
mod codec_parity;
mod codec_truth;
mod conformance;
mod frame_budget;
mod hub;
mod lm_parity;
mod lossy_formats;
mod marks;
mod plugins;
mod prefix_cache;
mod stream_session;
mod tokenizer_parity;
mod voice_clone_parity;
mod weights_auto;
