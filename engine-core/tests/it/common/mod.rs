//! Helpers shared by the engine's integration tests.

pub mod codec;
pub mod lm_fixtures;
pub mod seeded_weights;

pub use codec::max_abs_diff;

use std::path::{Path, PathBuf};

use kazeia_engine::stream::StreamConfig;

/// A codec golden fixture's directory (`tests/fixtures/codec/CASE`).
pub fn codec_fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/codec")
        .join(case)
}

/// That `ours` has `reference`'s length and differs from it by at most `tol` anywhere (`what` names the case
/// in the failure); the difference.
pub fn assert_within(what: &str, ours: &[f32], reference: &[f32], tol: f32) -> f32 {
    assert_eq!(ours.len(), reference.len(), "{what}: length");
    let err = max_abs_diff(ours, reference);
    assert!(err <= tol, "{what}: {err:e}");
    err
}

/// A session's chunking: chunks of `first` frames growing to `later`, `batch` chunks generated at once, the
/// decoder not profiled.
pub fn chunking(first: usize, later: usize, batch: usize) -> StreamConfig {
    StreamConfig {
        first_chunk_frames: first,
        chunk_frames: later,
        profile_decoder: false,
        batch,
        ..StreamConfig::default()
    }
}
