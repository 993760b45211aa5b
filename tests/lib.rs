//! Helpers shared by Kazeia's cross-crate tests (see `README.md`).

pub mod services;

use std::path::PathBuf;
use std::sync::OnceLock;

/// `tests/fixtures/` in the source tree.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// The CPU backend built as a plugin (`libkazeia_backend_cpu.so`).
///
/// `cargo test` builds only the plugin crate's rlib, and a `.so` left in `target/<profile>/` by an earlier
/// `cargo build` may be stale, so the tests build it with the running cargo into their own target directory
/// (the outer cargo holds the lock of the main one); when it is up to date that takes a second.
pub fn cpu_plugin() -> PathBuf {
    static PLUGIN: OnceLock<PathBuf> = OnceLock::new();
    PLUGIN
        .get_or_init(|| {
            let name = format!("libkazeia_backend_cpu{}", std::env::consts::DLL_SUFFIX);
            let exe = std::env::current_exe().expect("test executable path");
            let target = exe
                .ancestors()
                .nth(3)
                .expect("target/<profile>/deps/<test>")
                .join("plugin-for-tests");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = std::process::Command::new(cargo)
                .args([
                    "build",
                    "--quiet",
                    "-p",
                    "kazeia-backend-cpu",
                    "--target-dir",
                ])
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

/// The Vulkan backend built as a plugin (`libkazeia_backend_vulkan.so`), built the way [`cpu_plugin`] is.
pub fn vulkan_plugin() -> PathBuf {
    static PLUGIN: OnceLock<PathBuf> = OnceLock::new();
    PLUGIN
        .get_or_init(|| {
            let name = format!("libkazeia_backend_vulkan{}", std::env::consts::DLL_SUFFIX);
            let exe = std::env::current_exe().expect("test executable path");
            let target = exe
                .ancestors()
                .nth(3)
                .expect("target/<profile>/deps/<test>")
                .join("plugin-for-tests");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = std::process::Command::new(cargo)
                .args([
                    "build",
                    "--quiet",
                    "-p",
                    "kazeia-backend-vulkan",
                    "--target-dir",
                ])
                .arg(&target)
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("cannot run cargo to build the Vulkan plugin");
            assert!(status.success(), "building the Vulkan plugin failed");
            let built = target.join("debug").join(&name);
            assert!(built.is_file(), "{} was not built", built.display());
            built
        })
        .clone()
}

/// The Hexagon backend built as a plugin (`libkazeia_backend_hexagon.so`), built the way [`cpu_plugin`] is.
pub fn hexagon_plugin() -> PathBuf {
    static PLUGIN: OnceLock<PathBuf> = OnceLock::new();
    PLUGIN
        .get_or_init(|| {
            let name = format!("libkazeia_backend_hexagon{}", std::env::consts::DLL_SUFFIX);
            let exe = std::env::current_exe().expect("test executable path");
            let target = exe
                .ancestors()
                .nth(3)
                .expect("target/<profile>/deps/<test>")
                .join("plugin-for-tests");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = std::process::Command::new(cargo)
                .args([
                    "build",
                    "--quiet",
                    "-p",
                    "kazeia-backend-hexagon",
                    "--target-dir",
                ])
                .arg(&target)
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("cannot run cargo to build the Hexagon plugin");
            assert!(status.success(), "building the Hexagon plugin failed");
            let built = target.join("debug").join(&name);
            assert!(built.is_file(), "{} was not built", built.display());
            built
        })
        .clone()
}
