//! Helpers shared by Kazeia's cross-crate tests (see `README.md`).

use std::path::PathBuf;

/// `tests/fixtures/` in the source tree.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}
