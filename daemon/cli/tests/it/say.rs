//! `kazeia say`: through the daemon when the session bus has one (D-Bus activation starts `kazeia daemon`), in
//! process when there is no bus.

use std::path::{Path, PathBuf};
use std::process::Command;

use kazeia_tests::daemon_config::{activation_files, quick_model, write_config};
use kazeia_tests::services::{DbusSession, TempDir};

const KAZEIA: &str = env!("CARGO_BIN_EXE_kazeia");

/// D-Bus activation files for both names, running `kazeia daemon --config CONFIG` (the daemon's code).
fn activation_dir(dir: &Path, config: &Path) -> PathBuf {
    activation_files(dir, &format!("{KAZEIA} daemon"), config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn say_uses_the_daemon_and_falls_back_in_process() {
    let dir = TempDir::new("daemon-say");
    let config = dir.path().join("kazeia.toml");
    // The tiny model, its audio written to `wav`.
    let configure = |wav: &Path| {
        let sink = format!("wav:{}", wav.display());
        write_config(
            &config,
            &quick_model(),
            &sink,
            "[generation]\nmax_frames = 6\n",
        );
    };
    let wav = dir.path().join("said.wav");
    configure(&wav);
    // Through the daemon, which the bus starts on the first call.
    let bus = DbusSession::start(Some(&activation_dir(dir.path(), &config)));
    let out = Command::new(KAZEIA)
        .args(["say", "Through the daemon."])
        .envs(bus.env())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("in process"), "{stderr}");
    let first = std::fs::metadata(&wav).unwrap().len();
    assert!(first > 44);
    let out = Command::new(KAZEIA)
        .args(["say", "--voice", "nobody", "Bad voice."])
        .envs(bus.env())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown voice"));
    drop(bus);

    // No bus at all: in process, with the configuration given.
    let local_wav = dir.path().join("local.wav");
    configure(&local_wav);
    let out = Command::new(KAZEIA)
        .args([
            "say",
            "--config",
            &config.display().to_string(),
            "In process.",
        ])
        .env(
            "DBUS_SESSION_BUS_ADDRESS",
            format!("unix:path={}/none", dir.path().display()),
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("speaking in process"), "{stderr}");
    assert!(std::fs::metadata(&local_wav).unwrap().len() > 44);
}
