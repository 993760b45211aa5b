//! Helpers shared by Kazeia's cross-crate tests (see `README.md`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `tests/fixtures/` in the source tree.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// The CPU backend built as a plugin (`libkazeia_backend_cpu.so`).
///
/// `cargo build` puts it in `target/<profile>/`; `cargo test` alone builds only the rlib, so when it is missing
/// it is built here with the running cargo into its own target directory (the outer build holds the lock of
/// the main one).
pub fn cpu_plugin() -> PathBuf {
    static PLUGIN: OnceLock<PathBuf> = OnceLock::new();
    PLUGIN
        .get_or_init(|| {
            let name = format!("libkazeia_backend_cpu{}", std::env::consts::DLL_SUFFIX);
            let exe = std::env::current_exe().expect("test executable path");
            let profile_dir = exe
                .parent()
                .and_then(Path::parent)
                .expect("target/<profile>/deps");
            let next_to_binaries = profile_dir.join(&name);
            if next_to_binaries.is_file() {
                return next_to_binaries;
            }
            let target = profile_dir
                .parent()
                .expect("target dir")
                .join("plugin-for-tests");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = std::process::Command::new(cargo)
                .args(["build", "-p", "kazeia-backend-cpu", "--target-dir"])
                .arg(&target)
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("cannot run cargo to build the CPU plugin");
            assert!(status.success(), "building the CPU plugin failed");
            let built = target.join("debug").join(&name);
            assert!(built.is_file(), "{} was not built", built.display());
            built
        })
        .clone()
}
