//! The plugin as the engine and the CLI use it on a machine without a Hexagon DSP (this one, CI): loaded with
//! `dlopen`, listed as unavailable with the precise reason, and a stage asking for `hexagon` falls back to the
//! CPU with a logged warning.

use std::path::PathBuf;
use std::process::{Command, Output};

use kazeia_engine::plugins::{backend_named, discover, inspect};

fn plugin() -> PathBuf {
    kazeia_tests::hexagon_plugin()
}

fn plugin_dir() -> PathBuf {
    plugin().parent().unwrap().to_owned()
}

/// Runs the ignored test `name` of this module in a child process with `env` (the probe runs once per
/// process), returning its output.
fn child(name: &str, env: &[(&str, &str)]) -> String {
    kazeia_tests::run_ignored_test_in_child(module_path!(), name, env)
}

#[test]
fn without_libcdsprpc_the_plugin_is_unavailable_and_stages_fall_back_to_cpu() {
    let missing = "/nonexistent/libcdsprpc.so";
    let text = child("report_unavailable", &[("KAZEIA_CDSPRPC", missing)]);
    assert!(
        text.contains("no Qualcomm FastRPC runtime: cannot load /nonexistent/libcdsprpc.so"),
        "{text}"
    );
    // A library that loads but is not FastRPC's names the first missing entry point.
    let text = child("report_unavailable", &[("KAZEIA_CDSPRPC", "libm.so.6")]);
    assert!(
        text.contains(
            "libm.so.6 is not a usable FastRPC client library: it lacks remote_handle64_open"
        ),
        "{text}"
    );
}

/// The child side of the test above.
#[test]
#[ignore]
fn report_unavailable() {
    let found = discover(&[plugin_dir()]);
    let info = found
        .iter()
        .find(|p| p.name == "hexagon")
        .expect("the plugin is found");
    let reason = info.unavailable.clone().expect("unavailable");
    assert_eq!(info.score, 0);
    assert!(info.devices.is_empty());
    let (backend, warning) = backend_named("hexagon", 1, &found);
    assert_eq!(backend.name(), "cpu");
    let warning = warning.expect("a warning");
    assert_eq!(
        warning,
        format!("backend `hexagon` is unavailable ({reason}); falling back to cpu")
    );
    eprintln!("reason: {reason}");
}

#[test]
fn on_this_machine_the_default_library_is_absent() {
    // No Snapdragon here: the real probe (libcdsprpc.so by name) must say so, not crash or claim a device.
    if std::env::var_os("KAZEIA_CDSPRPC").is_some() {
        panic!("unset KAZEIA_CDSPRPC to run this test");
    }
    let info = inspect(&plugin());
    assert_eq!(info.name, "hexagon");
    let reason = info.unavailable.expect("no DSP on a host machine");
    assert!(
        reason.starts_with("no Qualcomm FastRPC runtime: cannot load libcdsprpc.so"),
        "{reason}"
    );
}

/// The `kazeia` binary: the one `cargo test --workspace` builds next to this test, else `KAZEIA_BIN`.
fn kazeia_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("KAZEIA_BIN") {
        return path.into();
    }
    let exe = std::env::current_exe().unwrap();
    let built = exe.ancestors().nth(2).unwrap().join("kazeia");
    assert!(
        built.is_file(),
        "{} is missing: run `cargo build -p kazeia --bin kazeia` (or the workspace tests), or set KAZEIA_BIN",
        built.display()
    );
    built
}

fn kazeia(args: &[&str]) -> Output {
    let dir = plugin_dir();
    Command::new(kazeia_bin())
        .args(args)
        .args(["--plugin-path", dir.to_str().unwrap()])
        .env_remove("KAZEIA_CDSPRPC")
        .env("KAZEIA_PLUGIN_PATH", "")
        .output()
        .expect("cannot run kazeia")
}

#[test]
fn kazeia_backends_lists_the_plugin_as_unavailable_with_the_reason() {
    let output = kazeia(&["backends"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("hexagon (plugin "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        line.contains("): unavailable — no Qualcomm FastRPC runtime: cannot load libcdsprpc.so"),
        "{line}"
    );
}

#[test]
fn a_bench_asking_for_hexagon_runs_on_the_cpu_with_a_warning() {
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/lm/shape_0b6");
    let output = kazeia(&[
        "bench",
        "--model",
        model.to_str().unwrap(),
        "--frames",
        "2",
        "--repeat",
        "1",
        "--json",
        "--cp-backend",
        "hexagon",
        "--decoder-backend",
        "hexagon",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("kazeia: warning: backend `hexagon`"))
        .collect();
    // One warning: the code predictor and the decoder share the one fallback.
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].contains("is unavailable (no Qualcomm FastRPC runtime"),
        "{stderr}"
    );
    assert!(warnings[0].ends_with("falling back to cpu"), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("\"frames\": 2"), "{stdout}");
}
