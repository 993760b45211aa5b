//! Helpers shared by Kazeia's cross-crate tests (see `README.md`).

pub mod daemon_config;
pub mod desktop;
pub mod hub_server;
pub mod services;

use std::path::PathBuf;
use std::sync::Mutex;

/// `n` test values in [-1, 1], spread by a hash of the index: the same for the same `seed` on every machine.
pub fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (((i as u32).wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40503)) % 2001) as f32
                / 1000.0
                - 1.0
        })
        .collect()
}

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

/// A copy of the model `src` at `model` (files linked) whose `config.json` is edited by `edit`.
pub fn linked_copy(
    src: &std::path::Path,
    model: &std::path::Path,
    edit: impl FnOnce(&mut serde_json::Value),
) -> PathBuf {
    std::fs::create_dir_all(model).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let name = entry.unwrap().file_name();
        if name != "config.json" {
            std::os::unix::fs::symlink(src.join(&name), model.join(&name)).unwrap();
        }
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    model.to_path_buf()
}

/// The CPU backend built as a plugin (`libkazeia_backend_cpu_plugin.so`).
///
/// `cargo test` builds only the plugin crate's rlib, and a `.so` left in `target/<profile>/` by an earlier
/// `cargo build` may be stale, so the tests build it with the running cargo into their own target directory
/// (the outer cargo holds the lock of the main one), once a test process; when it is up to date that takes
/// a second.
pub fn cpu_plugin() -> PathBuf {
    build_plugin("kazeia-backend-cpu-plugin", "cpu_plugin")
}

/// The CPU plugin built as [`cpu_plugin`] is, but with the release profile: what benchmarks time.
pub fn cpu_plugin_release() -> PathBuf {
    let args = ["--release", "-p", "kazeia-backend-cpu-plugin"];
    build_once(&args, "release", &plugin_file("cpu_plugin"))
}

/// The Vulkan backend built as a plugin (`libkazeia_backend_vulkan.so`), built the way [`cpu_plugin`] is.
pub fn vulkan_plugin() -> PathBuf {
    build_plugin("kazeia-backend-vulkan", "vulkan")
}

/// The Hexagon backend built as a plugin (`libkazeia_backend_hexagon.so`), built the way [`cpu_plugin`] is.
pub fn hexagon_plugin() -> PathBuf {
    build_plugin("kazeia-backend-hexagon", "hexagon")
}

/// A test plugin built for plugin ABI version 3 (`libkazeia_backend_stale.so`, `tests/stale-plugin`): it exports
/// only that version's entry symbol, so the loader must refuse it. Built the way [`cpu_plugin`] is.
pub fn stale_plugin() -> PathBuf {
    build_plugin("kazeia-backend-stale", "stale")
}

/// The speech-dispatcher module `sd_kazeia` (package `kazeia-speechd`), for the tests of other packages that
/// start it (`env!("CARGO_BIN_EXE_sd_kazeia")` names only a binary of the test's own package).
///
/// Built the way [`cpu_plugin`] is, with the running cargo into the tests' own target directory: `cargo test
/// -p kazeia` alone does not build another package's binary, and one left in `target/<profile>/` may be stale.
/// Tests built with `--release` (the timing benchmarks) get a release build of the module.
pub fn sd_kazeia() -> PathBuf {
    binary("kazeia-speechd", "sd_kazeia")
}

/// The daemon `kazeiad`, for the daemon's benchmark examples (`daemon/examples/`): cargo names a package's
/// binaries (`env!("CARGO_BIN_EXE_kazeiad")`) to its tests only, and `cargo run --example` builds none. Built
/// the way [`sd_kazeia`] is, with the release profile for a release build.
pub fn kazeiad() -> PathBuf {
    binary("kazeiad", "kazeiad")
}

/// `package`'s binary `bin`, built as [`cpu_plugin`] is, with the caller's profile (debug or release).
fn binary(package: &str, bin: &str) -> PathBuf {
    let mut args = vec!["-p", package, "--bin", bin];
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        args.push("--release");
        "release"
    };
    build_once(&args, profile, bin)
}

/// A test plugin named `faulty` (`libkazeia_backend_faulty.so`, `tests/faulty-plugin`): the CPU backend whose op
/// lists fail after `KAZEIA_FAULTY_AFTER` of them, built the way [`cpu_plugin`] is.
pub fn faulty_plugin() -> PathBuf {
    build_plugin("kazeia-backend-faulty", "faulty")
}

/// The file name of the backend plugin `libkazeia_backend_{file}.so`.
fn plugin_file(file: &str) -> String {
    format!("libkazeia_backend_{file}{}", std::env::consts::DLL_SUFFIX)
}

/// Builds `package`'s cdylib (`libkazeia_backend_{file}.so`) into `target/plugin-for-tests/` and returns its
/// path.
fn build_plugin(package: &str, file: &str) -> PathBuf {
    build_once(&["-p", package], "debug", &plugin_file(file))
}

/// `target/plugin-for-tests/PROFILE/FILE`, built by [`build_for_tests`] with `args` the first time a test
/// process asks for it (later calls, from any thread, wait for that build and reuse it).
fn build_once(args: &[&str], profile: &str, file: &str) -> PathBuf {
    static BUILT: Mutex<Vec<(Vec<String>, PathBuf)>> = Mutex::new(Vec::new());
    let key: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, path)) = built.iter().find(|(k, _)| *k == key) {
        return path.clone();
    }
    let path = build_for_tests(args).join(profile).join(file);
    assert!(path.is_file(), "{} was not built", path.display());
    built.push((key, path.clone()));
    path
}

/// Runs `cargo build --quiet ARGS` with the running cargo into `target/plugin-for-tests/` (the outer cargo
/// holds the lock of the main target directory) and returns that directory.
fn build_for_tests(args: &[&str]) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("target/<profile>/deps/<test> or target/<profile>/examples/<example>")
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
