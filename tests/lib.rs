//! Helpers shared by Kazeia's cross-crate tests (see `README.md`).

pub mod daemon_config;
pub mod desktop;
pub mod hub_server;
pub mod services;

use std::path::PathBuf;
use std::sync::OnceLock;

/// `tests/fixtures/` in the source tree.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// A model that speaks for seconds, made in `dir` from the committed fixtures with symlinks: the tiny
/// 0.6B-shaped LM with a codec at the released rates (80 ms frames of 1920 samples). For tests that listen.
pub fn speaking_model(dir: &std::path::Path) -> PathBuf {
    let model = dir.join("model");
    std::fs::create_dir_all(&model).expect("cannot create the model directory");
    let lm = fixtures_dir().join("lm/shape_0b6");
    for f in [
        "config.json",
        "generation_config.json",
        "merges.txt",
        "model.safetensors",
        "tokenizer_config.json",
        "vocab.json",
    ] {
        std::os::unix::fs::symlink(lm.join(f), model.join(f)).expect("cannot link a fixture");
    }
    std::os::unix::fs::symlink(
        fixtures_dir().join("codec/rates/speech_tokenizer"),
        model.join("speech_tokenizer"),
    )
    .expect("cannot link the codec fixture");
    model
}

/// The CPU backend built as a plugin (`libkazeia_backend_cpu_plugin.so`).
///
/// `cargo test` builds only the plugin crate's rlib, and a `.so` left in `target/<profile>/` by an earlier
/// `cargo build` may be stale, so the tests build it with the running cargo into their own target directory
/// (the outer cargo holds the lock of the main one); when it is up to date that takes a second.
pub fn cpu_plugin() -> PathBuf {
    static PLUGIN: OnceLock<PathBuf> = OnceLock::new();
    PLUGIN
        .get_or_init(|| build_plugin("kazeia-backend-cpu-plugin", "cpu_plugin"))
        .clone()
}

/// The CPU plugin built as [`cpu_plugin`] is, but with the release profile: what benchmarks time.
pub fn cpu_plugin_release() -> PathBuf {
    static PLUGIN: OnceLock<PathBuf> = OnceLock::new();
    PLUGIN
        .get_or_init(|| {
            let name = format!(
                "libkazeia_backend_cpu_plugin{}",
                std::env::consts::DLL_SUFFIX
            );
            let target = build_for_tests(&["--release", "-p", "kazeia-backend-cpu-plugin"]);
            let built = target.join("release").join(&name);
            assert!(built.is_file(), "{} was not built", built.display());
            built
        })
        .clone()
}

/// The Vulkan backend built as a plugin (`libkazeia_backend_vulkan.so`), built the way [`cpu_plugin`] is.
pub fn vulkan_plugin() -> PathBuf {
    static PLUGIN: OnceLock<PathBuf> = OnceLock::new();
    PLUGIN
        .get_or_init(|| build_plugin("kazeia-backend-vulkan", "vulkan"))
        .clone()
}

/// The Hexagon backend built as a plugin (`libkazeia_backend_hexagon.so`), built the way [`cpu_plugin`] is.
pub fn hexagon_plugin() -> PathBuf {
    static PLUGIN: OnceLock<PathBuf> = OnceLock::new();
    PLUGIN
        .get_or_init(|| build_plugin("kazeia-backend-hexagon", "hexagon"))
        .clone()
}

/// A test plugin named `faulty` (`libkazeia_backend_faulty.so`, `tests/faulty-plugin`): the CPU backend whose op
/// lists fail after `KAZEIA_FAULTY_AFTER` of them, built the way [`cpu_plugin`] is.
pub fn faulty_plugin() -> PathBuf {
    static PLUGIN: OnceLock<PathBuf> = OnceLock::new();
    PLUGIN
        .get_or_init(|| build_plugin("kazeia-backend-faulty", "faulty"))
        .clone()
}

/// A test plugin built for plugin ABI version 3 (`libkazeia_backend_stale.so`, `tests/stale-plugin`): it exports
/// only that version's entry symbol, so the loader must refuse it. Built the way [`cpu_plugin`] is.
pub fn stale_plugin() -> PathBuf {
    static PLUGIN: OnceLock<PathBuf> = OnceLock::new();
    PLUGIN
        .get_or_init(|| build_plugin("kazeia-backend-stale", "stale"))
        .clone()
}

/// The speech-dispatcher module `sd_kazeia` (package `kazeia-speechd`), for the tests of other packages that
/// start it (`env!("CARGO_BIN_EXE_sd_kazeia")` names only a binary of the test's own package).
///
/// Built the way [`cpu_plugin`] is, with the running cargo into the tests' own target directory: `cargo test
/// -p kazeia` alone does not build another package's binary, and one left in `target/<profile>/` may be stale.
/// Tests built with `--release` (the timing benchmarks) get a release build of the module.
pub fn sd_kazeia() -> PathBuf {
    static MODULE: OnceLock<PathBuf> = OnceLock::new();
    MODULE
        .get_or_init(|| {
            let mut args = vec!["-p", "kazeia-speechd", "--bin", "sd_kazeia"];
            let profile = if cfg!(debug_assertions) {
                "debug"
            } else {
                args.push("--release");
                "release"
            };
            let target = build_for_tests(&args);
            let built = target.join(profile).join("sd_kazeia");
            assert!(built.is_file(), "{} was not built", built.display());
            built
        })
        .clone()
}

/// Builds `package`'s cdylib (`libkazeia_backend_{file}.so`) into `target/plugin-for-tests/` and returns its
/// path.
fn build_plugin(package: &str, file: &str) -> PathBuf {
    let name = format!("libkazeia_backend_{file}{}", std::env::consts::DLL_SUFFIX);
    let target = build_for_tests(&["-p", package]);
    let built = target.join("debug").join(&name);
    assert!(built.is_file(), "{} was not built", built.display());
    built
}

/// Runs `cargo build --quiet ARGS` with the running cargo into `target/plugin-for-tests/` (the outer cargo
/// holds the lock of the main target directory) and returns that directory.
fn build_for_tests(args: &[&str]) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("target/<profile>/deps/<test>")
        .join("plugin-for-tests");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args(["build", "--quiet"])
        .args(args)
        .arg("--target-dir")
        .arg(&target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build {args:?}: {e}"));
    assert!(status.success(), "cargo build {args:?} failed");
    target
}

/// Runs the ignored test `module::name` of the running test binary in a child process with `env` added
/// (for what a process does once, such as a plugin's probe), and returns its output; fails if it fails.
/// `module` is the caller's `module_path!()`: tests are named `module::test` in a crate's one test binary.
pub fn run_ignored_test_in_child(module: &str, name: &str, env: &[(&str, &str)]) -> String {
    let module = module.split_once("::").map_or("", |(_, module)| module);
    let output = std::process::Command::new(std::env::current_exe().expect("test executable path"))
        .args([
            "--exact",
            &format!("{module}::{name}"),
            "--ignored",
            "--nocapture",
        ])
        .envs(env.iter().copied())
        .output()
        .expect("cannot run the test binary");
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{name} failed:\n{text}");
    text
}
