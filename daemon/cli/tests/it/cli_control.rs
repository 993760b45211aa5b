//! `kazeia voices`, `kazeia status`, `kazeia stop` and `kazeia say --list-voices` against the real daemon:
//! `kazeiad` D-Bus activated on a private bus, playing to a headless PipeWire (so speech takes real time).

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kazeia_tests::daemon_config::write_config;
use kazeia_tests::desktop::name_has_owner;
use kazeia_tests::services::{DbusSession, PipeWire, TempDir};
use kazeia_tests::speaking_model;

const KAZEIA: &str = env!("CARGO_BIN_EXE_kazeia");

fn kazeia(bus: &DbusSession, args: &[&str]) -> Command {
    let mut cmd = Command::new(KAZEIA);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(bus.env())
        .args(args);
    cmd
}

fn run(bus: &DbusSession, args: &[&str]) -> Output {
    kazeia(bus, args).output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The daemon's pid as the bus knows it (dbus-send, independent of the code under test).
fn daemon_pid(bus: &DbusSession) -> u32 {
    let out = Command::new("dbus-send")
        .args([
            &format!("--bus={}", bus.address()),
            "--print-reply",
            "--dest=org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus.GetConnectionUnixProcessID",
            "string:org.kazeia.Speech",
        ])
        .output()
        .unwrap();
    let text = stdout(&out);
    text.split_whitespace()
        .skip_while(|w| *w != "uint32")
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid: {text}"))
}

fn write_activation(dir: &Path, config: &Path) -> std::path::PathBuf {
    kazeia_tests::daemon_config::activation_files(dir, &format!("{KAZEIA} daemon"), config)
}

#[test]
fn voices_status_and_stop_talk_to_the_daemon() {
    let dir = TempDir::new("ctl");
    let model = speaking_model(dir.path());
    let config = dir.path().join("kazeia.toml");
    write_config(&config, &model, "pipewire", "[generation]\ngreedy = true\n");
    let bus = DbusSession::start(Some(&write_activation(dir.path(), &config)));
    let _pw = PipeWire::start(&bus);

    // status and stop never start the daemon.
    let status = run(&bus, &["status"]);
    assert!(!status.status.success());
    assert!(
        stderr(&status).contains("kazeiad is not running"),
        "{status:?}"
    );
    let stop = run(&bus, &["stop"]);
    assert!(stop.status.success(), "{stop:?}");
    assert!(stdout(&stop).contains("not running"), "{stop:?}");
    assert!(!name_has_owner(&bus, "org.kazeia.Speech"));

    // voices starts it, and lists each voice with its languages, as the API does.
    let voices = run(&bus, &["voices"]);
    assert!(voices.status.success(), "{voices:?}");
    let listed = stdout(&voices);
    let mut lines = listed.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["ID", "NAME", "LANGUAGES"]);
    let api = Command::new("busctl")
        .arg(format!("--address={}", bus.address()))
        .args([
            "call",
            "org.kazeia.Speech",
            "/org/kazeia/Speech",
            "org.kazeia.Speech1",
            "ListVoices",
        ])
        .output()
        .unwrap();
    let api = stdout(&api);
    let rows: Vec<&str> = lines.collect();
    assert!(!rows.is_empty(), "{listed}");
    for row in &rows {
        let id = row.split_whitespace().next().unwrap();
        assert!(api.contains(&format!("\"{id}\"")), "{id} not in {api}");
        let languages = row.rsplit("  ").next().unwrap();
        for tag in languages.split(' ') {
            assert!(api.contains(tag), "{tag} not in {api}");
        }
    }
    // busctl prints `a(sss) COUNT "id" "name" "tags" …`.
    let count: usize = api.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_eq!(rows.len(), count, "{listed}\n{api}");
    let say_list = run(&bus, &["say", "--list-voices"]);
    assert_eq!(stdout(&say_list), listed, "{say_list:?}");
    let none = run(&bus, &["voices", "--language", "tlh"]);
    assert!(!none.status.success());
    assert!(stderr(&none).contains("no voice speaks `tlh`"), "{none:?}");

    // status: running, the daemon's pid and memory, idle, the model, its weights, each stage's backend, the
    // queue.
    let status = run(&bus, &["status"]);
    assert!(status.status.success(), "{status:?}");
    let shown = stdout(&status);
    let pid = daemon_pid(&bus);
    assert!(
        shown.starts_with(&format!("kazeiad: running, pid {pid}, "))
            && shown.contains(" MB resident\n"),
        "{shown}"
    );
    for line in [
        "state: idle\n".to_owned(),
        format!("model: {}\n", model.display()),
        // The default `weights = "auto"`: the format it chose and why.
        "\nweights: ".to_owned(),
        " (auto: ".to_owned(),
        "predicted RTF bf16 ".to_owned(),
        "backends: talker cpu, code_predictor cpu, decoder cpu\n".to_owned(),
        "audio sink: ".to_owned(),
        "queue: 0 utterance(s)".to_owned(),
    ] {
        assert!(shown.contains(&line), "{line:?} not in:\n{shown}");
    }

    // stop silences a long utterance in progress: its `kazeia say` ends, told it was stopped.
    let long = "Hello world, this is a test. ".repeat(30);
    let mut say = kazeia(&bus, &["say", &long])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !stdout(&run(&bus, &["status"])).contains("state: speaking") {
        assert!(Instant::now() < deadline, "never speaking");
        assert!(say.try_wait().unwrap().is_none(), "say ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    let stop = run(&bus, &["stop"]);
    assert!(stop.status.success(), "{stop:?}");
    assert_eq!(stdout(&stop), "stopped 1 utterance(s)\n");
    let stopped_at = Instant::now();
    let said = loop {
        if say.try_wait().unwrap().is_some() {
            break say.wait_with_output().unwrap();
        }
        assert!(
            stopped_at.elapsed() < Duration::from_secs(5),
            "say still waits"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(!said.status.success());
    assert!(stderr(&said).contains("stopped"), "{said:?}");

    // stop --daemon ends it; it is gone from the bus.
    let stop = run(&bus, &["stop", "--daemon"]);
    assert!(stop.status.success(), "{stop:?}");
    assert!(
        stdout(&stop).contains(&format!("kazeiad (pid {pid}) ended")),
        "{stop:?}"
    );
    assert!(!name_has_owner(&bus, "org.kazeia.Speech"));
    assert!(!run(&bus, &["status"]).status.success());
}

#[test]
fn help_texts_have_examples() {
    for command in [
        "say",
        "voices",
        "status",
        "stop",
        "synth",
        "install",
        "uninstall",
        "model",
    ] {
        let out = Command::new(KAZEIA)
            .args([command, "--help"])
            .output()
            .unwrap();
        assert!(out.status.success());
        let help = stdout(&out);
        assert!(
            help.contains("Examples:\n  kazeia ") || help.contains("Examples:\n  sudo kazeia"),
            "kazeia {command} --help:\n{help}"
        );
    }
}

/// `kazeia model download` from a local hub server: the size said before anything is fetched, an interrupted
/// download continued (saying what was already there), the converted weights cached; `list` shows the model
/// and whether it is the daemon's; `remove` deletes it.
#[test]
fn model_download_list_and_remove() {
    use kazeia_tests::hub_server::{Hub, REPO};
    let dir = TempDir::new("cli-model");
    let hub = Hub::start();
    let cache = dir.path().join("hub");
    let config = dir.path().join("kazeia.toml");
    std::fs::write(
        &config,
        format!("[model]\npath = \"{REPO}\"\nweights = \"q8_0\"\n"),
    )
    .unwrap();
    let model = |args: &[&str]| {
        Command::new(KAZEIA)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", dir.path())
            .env("HF_ENDPOINT", &hub.endpoint)
            .env("HF_HUB_CACHE", &cache)
            .env("KAZEIA_CACHE_DIR", dir.path().join("weights"))
            .env("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent")
            .arg("model")
            .args(args)
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap()
    };
    // Cut short: it says how much there is first, then fails saying it continues next time.
    hub.state().cut = Some(("model.safetensors".into(), 1000));
    let first = model(&["download"]);
    assert!(!first.status.success());
    let said = stdout(&first);
    assert!(
        said.contains(&format!("{REPO}: 8 files,")) && said.contains("to download"),
        "{said}"
    );
    assert!(
        stderr(&first).contains("continues from there"),
        "{}",
        stderr(&first)
    );
    let second = model(&["download"]);
    assert!(second.status.success(), "{}", stderr(&second));
    let said = stdout(&second);
    assert!(
        said.contains("already here from an earlier download"),
        "{said}"
    );
    let ranges = hub.gets("model.safetensors");
    assert_eq!(ranges.len(), 2);
    assert!(ranges[1] >= 1000, "not continued: {ranges:?}");
    // The weights were converted to the configured q8_0 and cached.
    assert!(
        std::fs::read_dir(dir.path().join("weights"))
            .unwrap()
            .count()
            > 0
    );
    let again = model(&["download"]);
    assert!(
        stdout(&again).contains("is already here"),
        "{}",
        stdout(&again)
    );

    let listed = stdout(&model(&["list"]));
    let line = listed
        .lines()
        .find(|l| l.contains(REPO))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(
        line.contains("complete") && line.contains("(the daemon's)"),
        "{listed}"
    );
    let removed = model(&["remove", REPO]);
    assert!(removed.status.success(), "{}", stderr(&removed));
    assert!(
        stdout(&removed).contains("the daemon is configured to use it"),
        "{}",
        stdout(&removed)
    );
    let listed = stdout(&model(&["list"]));
    assert!(
        listed.contains("none") && listed.contains("is not on this machine"),
        "{listed}"
    );
    let gone = model(&["remove", REPO]);
    assert!(!gone.status.success());
}

/// Errors a person can act on: one line, the cause once, checked before anything slow starts.
#[test]
fn errors_are_one_line_with_their_cause_once() {
    let dir = TempDir::new("cli-errors");
    let no_bus = format!("unix:path={}/no-bus", dir.path().display());
    let kazeia = |args: &[&str]| {
        Command::new(KAZEIA)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", dir.path())
            .env("DBUS_SESSION_BUS_ADDRESS", &no_bus)
            .env("HF_HUB_OFFLINE", "1")
            .args(args)
            .output()
            .unwrap()
    };
    let status = kazeia(&["status"]);
    let said = stderr(&status);
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(said.contains("no session bus"), "{said}");
    let cause = "No such file or directory";
    assert_eq!(said.matches(cause).count(), 1, "the cause twice: {said}");
    // Empty text: refused at once, without starting the daemon or loading a model in process.
    let asked = Instant::now();
    let empty = kazeia(&["say", "  "]);
    assert!(!empty.status.success());
    assert_eq!(
        stderr(&empty).trim(),
        "kazeia: error: the text is empty: nothing to say"
    );
    assert!(asked.elapsed() < Duration::from_secs(5));
}
