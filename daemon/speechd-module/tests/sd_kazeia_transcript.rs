//! Golden transcripts of the real `sd_kazeia` binary on stdin/stdout, as speech-dispatcher starts a module
//! (`linux-speech-stack.md` §1.8), on a private session bus where the daemon cannot run.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kazeia_tests::desktop::SPEECHD_DEFAULT_SET;
use kazeia_tests::services::{require_program, wait_or_kill, DbusSession, TempDir};

/// What speech-dispatcher 0.11.4 sends a module at startup and for one `spd-say` message.
fn startup() -> Vec<&'static str> {
    let init = [
        "INIT",
        "AUDIO",
        "audio_output_method=server",
        ".",
        "LOGLEVEL",
        "log_level=0",
        ".",
        "LIST VOICES",
        "LIST VOICES",
    ];
    let message = [
        "SPEAK",
        "<speak>One.<mark name=\"__spd_0\"/> Two &amp; &lt;three&gt;?<mark name=\"__spd_1\"/> Four!</speak>",
        ".",
        "CHAR",
        "x",
        ".",
        "BOGUS",
        "DEBUG OFF ",
        "QUIT",
    ];
    [&init[..], SPEECHD_DEFAULT_SET, &message[..]].concat()
}

/// Runs `sd_kazeia [config]` with `env` only, feeds it `input`; returns stdout lines, stderr and the status.
fn run_module(
    env: &[(String, String)],
    config: Option<&Path>,
    input: &[&str],
) -> (Vec<String>, String, i32) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sd_kazeia"));
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(c) = config {
        cmd.arg(c);
    }
    let mut child = cmd.spawn().expect("cannot start sd_kazeia");
    let mut stdin = child.stdin.take().unwrap();
    let text: String = input.iter().map(|l| format!("{l}\n")).collect();
    // The module may exit early (failed INIT): a broken pipe here is part of what is tested.
    let _ = stdin.write_all(text.as_bytes());
    drop(stdin);
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let status = wait_or_kill(&mut child, Duration::from_secs(60))
        .unwrap_or_else(|| panic!("sd_kazeia did not finish within 60 s"));
    let stdout = out.join().unwrap();
    let stderr = err.join().unwrap();
    let lines = stdout.lines().map(str::to_string).collect();
    (lines, stderr, status.code().unwrap_or(-1))
}

/// A service directory in which the provider is activatable but its program fails at once.
fn failing_activation(dir: &Path) -> std::path::PathBuf {
    let services = dir.join("services");
    std::fs::create_dir(&services).unwrap();
    let fail = require_program("false");
    std::fs::write(
        services.join("org.kazeia.Speech.Provider.service"),
        format!(
            "[D-BUS Service]\nName=org.kazeia.Speech.Provider\nExec={}\n",
            fail.display()
        ),
    )
    .unwrap();
    services
}

#[test]
fn startup_and_messages_when_the_daemon_cannot_start() {
    let dir = TempDir::new("sd-kazeia");
    let bus = DbusSession::start(Some(&failing_activation(dir.path())));
    let started = Instant::now();
    let (lines, stderr, status) = run_module(&bus.env(), None, &startup());
    let took = started.elapsed();
    let want = [
        "299-kazeia: speech provider org.kazeia.Speech.Provider activatable",
        "299 OK LOADED SUCCESSFULLY",
        "207 OK RECEIVING AUDIO SETTINGS",
        "203 OK AUDIO INITIALIZED",
        "207 OK RECEIVING LOGLEVEL SETTINGS",
        "203 OK LOGLEVEL SET",
        "304 CANT LIST VOICES",
        "304 CANT LIST VOICES",
        "203 OK RECEIVING SETTINGS",
        "203 OK SETTINGS RECEIVED",
        "202 OK RECEIVING MESSAGE",
        "301 ERROR CANT SPEAK",
        "202 OK RECEIVING MESSAGE",
        "301 ERROR CANT SPEAK",
        "300 ERR UNKNOWN COMMAND",
        "200 OK DEBUGGING OFF",
        "210 OK QUIT",
    ];
    assert_eq!(lines, want, "stderr:\n{stderr}");
    assert_eq!(status, 0, "stderr:\n{stderr}");
    // The failures are explained on stderr (speech-dispatcher's module log).
    assert!(
        stderr.contains("cannot list the provider's voices"),
        "{stderr}"
    );
    eprintln!("whole transcript with 4 failed activations: {took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn init_fails_without_a_provider() {
    let bus = DbusSession::start(None);
    let (lines, stderr, status) = run_module(&bus.env(), None, &startup());
    assert_eq!(
        lines,
        [
            "399-org.kazeia.Speech.Provider is neither running nor activatable on the session bus \
             (is kazeiad installed?)",
            "399 ERR CANT INIT MODULE",
        ],
        "stderr:\n{stderr}"
    );
    assert_eq!(status, 1);
}

#[test]
fn init_fails_without_a_session_bus() {
    let dir = TempDir::new("sd-kazeia-nobus");
    let env = [(
        "DBUS_SESSION_BUS_ADDRESS".to_string(),
        format!("unix:path={}/no-bus-here", dir.path().display()),
    )];
    let (lines, stderr, status) = run_module(&env, None, &startup());
    assert_eq!(lines.len(), 2, "{lines:?}\nstderr:\n{stderr}");
    assert!(
        lines[0].starts_with("399-cannot connect to the session bus"),
        "{lines:?}"
    );
    // The cause once, not once per layer of the error chain.
    assert_eq!(
        lines[0].matches("No such file or directory").count(),
        1,
        "{lines:?}"
    );
    assert_eq!(lines[1], "399 ERR CANT INIT MODULE");
    assert_eq!(status, 1);
}

#[test]
fn config_file_is_read_and_checked() {
    let dir = TempDir::new("sd-kazeia-conf");
    let bus = DbusSession::start(Some(&failing_activation(dir.path())));
    // The shipped file works as it is.
    let shipped =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/speech-dispatcher/kazeia.conf");
    let (lines, stderr, status) = run_module(&bus.env(), Some(&shipped), &["INIT", "QUIT"]);
    assert_eq!(
        lines,
        [
            "299-kazeia: speech provider org.kazeia.Speech.Provider activatable",
            "299 OK LOADED SUCCESSFULLY",
            "210 OK QUIT"
        ],
        "stderr:\n{stderr}"
    );
    assert_eq!(status, 0);
    // Another provider name is used; a bad line fails INIT with its reason.
    let other = dir.path().join("other.conf");
    std::fs::write(&other, "KazeiaProvider org.example.None.Speech.Provider\n").unwrap();
    let (lines, _, _) = run_module(&bus.env(), Some(&other), &["INIT"]);
    assert!(
        lines[0].starts_with("399-org.example.None.Speech.Provider is neither running"),
        "{lines:?}"
    );
    let bad = dir.path().join("bad.conf");
    std::fs::write(&bad, "# comment\nKazeiaVolume 3\n").unwrap();
    let (lines, _, status) = run_module(&bus.env(), Some(&bad), &["INIT"]);
    assert_eq!(
        lines,
        [
            format!(
                "399-{}: line 2: unknown setting KazeiaVolume",
                bad.display()
            ),
            "399 ERR CANT INIT MODULE".to_string()
        ]
    );
    assert_eq!(status, 1);
}

/// `sd_kazeia --help` explains itself and exits, rather than reading `--help` as its config file.
#[test]
fn help_is_help() {
    let out = Command::new(env!("CARGO_BIN_EXE_sd_kazeia"))
        .arg("--help")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("speech-dispatcher") && said.contains("spd-say"),
        "{said}"
    );
}
