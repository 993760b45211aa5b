//! The daemon's log level: `RUST_LOG` when set, else `[log] level`; lines say whose they are and hold no
//! `\r` (progress is never drawn off a terminal). `kazeiad` runs on a private bus with a tiny model.

use std::path::Path;
use std::time::{Duration, Instant};

use kazeia_tests::desktop::name_has_owner;
use kazeia_tests::fixtures_dir;
use kazeia_tests::services::{retry, DbusSession, Service, TempDir};

use crate::common::{busctl, state};

const KAZEIAD: &str = env!("CARGO_BIN_EXE_kazeiad");

/// Runs kazeiad with `[log] level = level` (and `rust_log`, if any) until it is ready, stops it, returns
/// its standard error.
fn daemon_log(dir: &Path, level: &str, rust_log: Option<&str>) -> String {
    let config = dir.join(format!("kazeia-{level}.toml"));
    std::fs::write(
        &config,
        format!(
            "[model]\npath = \"{}\"\n[audio]\nsink = \"null\"\n[threads]\ntalker = 1\n\
             code_predictor = 1\ndecoder = 1\n[log]\nlevel = \"{level}\"\n",
            fixtures_dir().join("lm/shape_0b6").display()
        ),
    )
    .unwrap();
    let bus = DbusSession::start(None);
    let mut env = bus.env();
    if let Some(v) = rust_log {
        env.push(("RUST_LOG".into(), v.into()));
    }
    let mut daemon = Service::spawn(
        KAZEIAD,
        &["--config", &config.display().to_string()],
        &env,
        dir.join(format!(
            "kazeiad-{level}-{}.log",
            rust_log.unwrap_or("unset")
        )),
    );
    // Ready: on the bus (the name comes first) and the model loaded (`State` leaves `loading`).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(name_has_owner(&bus, "org.kazeia.Speech") && state(&bus) == "s \"idle\"") {
        daemon.check_running();
        assert!(Instant::now() < deadline, "kazeiad never got ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    daemon.terminate();
    daemon.log()
}

#[test]
fn rust_log_wins_over_the_configured_level() {
    let dir = TempDir::new("log");
    let info = daemon_log(dir.path(), "info", None);
    assert!(
        info.contains("kazeiad: serving as org.kazeia.Speech"),
        "{info}"
    );
    assert!(info.contains("; ready ("), "{info}");
    assert!(info.contains("kazeiad: stopped"), "{info}");

    // warn: the information lines are gone (the level applies from the configuration's loading on).
    let warn = daemon_log(dir.path(), "warn", None);
    assert!(!warn.contains("serving as"), "{warn}");
    assert!(!warn.contains("ready ("), "{warn}");
    assert!(!warn.contains("stopped"), "{warn}");

    // RUST_LOG decides when set.
    let env = daemon_log(dir.path(), "warn", Some("info"));
    assert!(
        env.contains("kazeiad: serving as org.kazeia.Speech"),
        "{env}"
    );
    assert!(env.contains("kazeiad: stopped"), "{env}");

    for log in [&info, &warn, &env] {
        assert!(!log.contains('\r'), "{log:?}");
    }
}

/// A bad level makes the file invalid: the daemon says why (log, `ConfigProblem`) and serves on the
/// defaults rather than not at all.
#[test]
fn a_bad_level_is_refused_with_the_reason() {
    let dir = TempDir::new("badlog");
    let config = dir.path().join("kazeia.toml");
    std::fs::write(&config, "[log]\nlevel = \"kazeia=loudest\"\n").unwrap();
    let bus = DbusSession::start(None);
    let mut env = bus.env();
    for (key, value) in [
        ("HF_HUB_OFFLINE", "1".to_owned()),
        ("HF_HUB_CACHE", dir.path().join("hub").display().to_string()),
        (
            "XDG_CACHE_HOME",
            dir.path().join("cache").display().to_string(),
        ),
    ] {
        env.push((key.into(), value));
    }
    let mut daemon = Service::spawn(
        KAZEIAD,
        &["--config", &config.display().to_string()],
        &env,
        dir.path().join("kazeiad.log"),
    );
    let problem = retry(Duration::from_secs(60), Duration::from_millis(20), || {
        daemon.check_running();
        let out = busctl(
            &bus,
            &[
                "get-property",
                "org.kazeia.Speech",
                "/org/kazeia/Speech",
                "org.kazeia.Speech1",
                "ConfigProblem",
            ],
        );
        let problem = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if problem.len() > 4 {
            Ok(problem)
        } else {
            Err(())
        }
    })
    .unwrap_or_else(|()| panic!("no ConfigProblem: {}", daemon.log()));
    let reason = "[log] level: `kazeia=loudest` is not a log level";
    assert!(problem.contains(reason), "{problem}");
    daemon.terminate();
    let log = daemon.log();
    assert!(
        log.contains(reason) && log.contains("built-in defaults"),
        "{log}"
    );
}
