//! Helpers shared by the engine's integration tests.

pub mod lm_fixtures;
pub mod seeded_weights;

use std::path::{Path, PathBuf};

/// A codec golden fixture's directory (`tests/fixtures/codec/CASE`).
pub fn codec_fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/codec")
        .join(case)
}

/// The largest absolute difference of two signals of one length.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
