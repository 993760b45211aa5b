//! A desktop session for screen-reader tests, each part private to the test that starts it: an X server
//! (`Xvfb`), the AT-SPI accessibility bus, a private `speech-dispatcher`, Orca, and a small GTK window
//! (`gtk_window.py`). No window manager is needed: GTK focuses its own window (`present()`), and Orca hears
//! of it through AT-SPI as it would on a desktop.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::services::{require_program, retry, wait_or_kill, wait_until, DbusSession, Service};

/// A headless X server on a free display.
pub struct Xvfb {
    service: Service,
    display: String,
}

impl Xvfb {
    pub fn start(dir: &Path) -> Xvfb {
        let log = dir.join("xvfb.log");
        // -displayfd: the server picks a free display and prints its number (to the log) once it listens.
        let mut service = Service::spawn(
            "Xvfb",
            &[
                "-displayfd",
                "1",
                "-screen",
                "0",
                "1024x768x24",
                "-nolisten",
                "tcp",
            ],
            &[],
            log.clone(),
        );
        let mut display = String::new();
        wait_until("Xvfb to pick a display", || {
            service.check_running();
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            match text.lines().find(|l| l.trim().parse::<u32>().is_ok()) {
                Some(number) => {
                    display = format!(":{}", number.trim());
                    true
                }
                None => false,
            }
        });
        Xvfb { service, display }
    }

    /// `DISPLAY` for clients.
    pub fn display(&self) -> &str {
        &self.display
    }

    pub fn check_running(&mut self) {
        self.service.check_running();
    }
}

/// The AT-SPI accessibility bus (`at-spi-bus-launcher`: its own dbus-daemon, announced on the session bus
/// as `org.a11y.Bus` and on the X root window); the registry daemon is activated on it when Orca connects.
pub struct AtSpi {
    service: Service,
}

const AT_SPI_BUS_LAUNCHER: &str = "/usr/libexec/at-spi-bus-launcher";

impl AtSpi {
    /// `env`: the session bus and `DISPLAY`.
    pub fn start(dir: &Path, bus: &DbusSession, env: &[(String, String)]) -> AtSpi {
        assert!(
            Path::new(AT_SPI_BUS_LAUNCHER).is_file(),
            "{AT_SPI_BUS_LAUNCHER} is missing: install the Debian package `at-spi2-core` (tools/deps.sh)"
        );
        let mut service = Service::spawn(
            AT_SPI_BUS_LAUNCHER,
            &["--launch-immediately"],
            env,
            dir.join("at-spi.log"),
        );
        wait_until("the accessibility bus on the session bus", || {
            service.check_running();
            name_has_owner(bus, "org.a11y.Bus")
        });
        AtSpi { service }
    }

    pub fn log(&self) -> String {
        self.service.log()
    }
}

/// Whether `name` has an owner on `bus` (dbus-send, so no client library is needed).
pub fn name_has_owner(bus: &DbusSession, name: &str) -> bool {
    let out = Command::new(require_program("dbus-send"))
        .args([
            &format!("--bus={}", bus.address()),
            "--print-reply",
            "--dest=org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus.NameHasOwner",
            &format!("string:{name}"),
        ])
        .output();
    out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("boolean true"))
}

/// The settings speech-dispatcher 0.11.4 sends a module before `spd-say`'s first message, at its defaults
/// (a whole `SET` block, for tests that speak the module protocol as speech-dispatcher does).
pub const SPEECHD_DEFAULT_SET: &[&str] = &[
    "SET",
    "pitch=-10",
    "pitch_range=0",
    "rate=20",
    "volume=0",
    "punctuation_mode=none",
    "spelling_mode=off",
    "cap_let_recogn=none",
    "voice=male1",
    "language=en",
    "synthesis_voice=NULL",
    ".",
];

/// A private speech-dispatcher (`linux-speech-stack.md` §5) on a unix socket, playing server audio through
/// PulseAudio (pipewire-pulse), with its configuration directory `conf` (`speechd.conf`, `modules/`).
pub struct SpeechDispatcher {
    service: Service,
    socket: PathBuf,
    logs: PathBuf,
    env: Vec<(String, String)>,
}

impl SpeechDispatcher {
    /// `module_dir`: where to find `sd_*` modules besides the compiled-in directory (`-m`); `env`: the
    /// audio and bus environment (e.g. `PipeWire::env()` with pulse).
    pub fn start(
        dir: &Path,
        conf: &Path,
        module_dir: Option<&Path>,
        env: &[(String, String)],
    ) -> SpeechDispatcher {
        Self::start_logging(dir, conf, module_dir, env, 4)
    }

    /// [`SpeechDispatcher::start`] with log level `level` (5 logs every line exchanged with the modules,
    /// with its time: see [`SpeechDispatcher::server_log`]).
    pub fn start_logging(
        dir: &Path,
        conf: &Path,
        module_dir: Option<&Path>,
        env: &[(String, String)],
        level: u8,
    ) -> SpeechDispatcher {
        Self::spawn(dir, Some(conf), module_dir, env, level)
    }

    /// As a user's session starts it: its configuration and modules found where it looks by itself (the
    /// user's `~/.config/speech-dispatcher` and `~/.local/libexec/speech-dispatcher-modules` beside the system's),
    /// from the `HOME` in `env`.
    pub fn start_for_user(dir: &Path, env: &[(String, String)]) -> SpeechDispatcher {
        Self::spawn(dir, None, None, env, 4)
    }

    fn spawn(
        dir: &Path,
        conf: Option<&Path>,
        module_dir: Option<&Path>,
        env: &[(String, String)],
        level: u8,
    ) -> SpeechDispatcher {
        let level = level.to_string();
        let logs = dir.join("sdlog");
        std::fs::create_dir_all(&logs).unwrap();
        let socket = dir.join("speechd.sock");
        let mut args: Vec<String> = [
            "-s",
            "-l",
            &level,
            "-c",
            "unix_socket",
            "-S",
            &socket.display().to_string(),
            "-L",
            &logs.display().to_string(),
            "-P",
            &dir.join("speechd.pid").display().to_string(),
            "-t",
            "0",
        ]
        .map(String::from)
        .to_vec();
        if let Some(c) = conf {
            args.extend(["-C".to_owned(), c.display().to_string()]);
        }
        if let Some(m) = module_dir {
            args.extend(["-m".to_owned(), m.display().to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // Its log's clock times in UTC, as `speechd_log_entries` reads them.
        let mut server_env = env.to_vec();
        server_env.push(("TZ".into(), "UTC".into()));
        let mut service = Service::spawn(
            "speech-dispatcher",
            &args,
            &server_env,
            dir.join("speech-dispatcher.out"),
        );
        wait_until("speech-dispatcher's socket", || {
            service.check_running();
            socket.exists()
        });
        let mut env = env.to_vec();
        env.push((
            "SPEECHD_ADDRESS".into(),
            format!("unix_socket:{}", socket.display()),
        ));
        SpeechDispatcher {
            service,
            socket,
            logs,
            env,
        }
    }

    /// The caller's environment plus `SPEECHD_ADDRESS`, for clients (spd-say, Orca).
    pub fn env(&self) -> Vec<(String, String)> {
        self.env.clone()
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Runs `spd-say ARGS` against this server; panics with the logs if it takes longer than `limit`.
    /// Asks for `module`'s voices until it lists some, within `limit`: a module whose daemon is still loading
    /// its model answers at once that it has none yet (`sd_kazeia` starts kazeiad at its INIT). The list.
    pub fn wait_for_voices(&self, module: &str, limit: Duration) -> String {
        retry(limit, Duration::from_millis(200), || {
            let voices = self.spd_say(&["-o", module, "-L"], Duration::from_secs(10));
            let listed = String::from_utf8_lossy(&voices.stdout).into_owned();
            if voices.status.success() && listed.lines().count() >= 2 {
                Ok(listed)
            } else {
                Err(listed)
            }
        })
        .unwrap_or_else(|listed| {
            panic!(
                "{module} listed no voices within {limit:?}:\n{listed}\n{}",
                self.logs()
            )
        })
    }

    pub fn spd_say(&self, args: &[&str], limit: Duration) -> Output {
        let mut child = Command::new(require_program("spd-say"))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot run spd-say");
        if wait_or_kill(&mut child, limit).is_none() {
            panic!(
                "spd-say {args:?} did not finish within {limit:?}\n{}",
                self.logs()
            );
        }
        child.wait_with_output().unwrap()
    }

    /// The server's own log so far (`speech-dispatcher.log`).
    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.logs.join("speech-dispatcher.log")).unwrap_or_default()
    }

    /// The server's output, the end of its log and each module's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut all = format!("--- speech-dispatcher output:\n{}", self.service.log());
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.logs)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            all += &format!("\n--- {} (end):\n{}", file.display(), tail.join("\n"));
        }
        all
    }

    pub fn check_running(&mut self) {
        self.service.check_running();
    }
}

/// Orca, with its debug log (`--debug-file`), from which the test reads what Orca asked to be spoken and
/// when.
pub struct Orca {
    service: Service,
    debug: PathBuf,
}

impl Orca {
    /// `env`: session bus, `DISPLAY`, `SPEECHD_ADDRESS`, a private HOME and XDG dirs (Orca keeps its
    /// settings in `$XDG_DATA_HOME/orca`; none there means Orca's defaults).
    pub fn start(dir: &Path, env: &[(String, String)]) -> Orca {
        let debug = dir.join("orca-debug.log");
        let mut env = env.to_vec();
        // GSettings in memory: no dconf daemon, nothing read from or left in the real user's settings;
        // UTC, so the debug log's clock times are UTC.
        env.push(("GSETTINGS_BACKEND".into(), "memory".into()));
        env.push(("TZ".into(), "UTC".into()));
        // Orca's own settings directory, with defaults everywhere; its customizations file only makes the
        // debug log line-buffered, so each line can be read (and its time used) as soon as it is written.
        let prefs = dir.join("orca-prefs");
        std::fs::create_dir_all(&prefs).unwrap();
        std::fs::write(
            prefs.join("orca-customizations.py"),
            "import orca.debug\n\
             if orca.debug.debugFile:\n    orca.debug.debugFile.reconfigure(line_buffering=True)\n",
        )
        .unwrap();
        let service = Service::spawn(
            "orca",
            &[
                &format!("--debug-file={}", debug.display()),
                &format!("--user-prefs={}", prefs.display()),
            ],
            &env,
            dir.join("orca.out"),
        );
        Orca { service, debug }
    }

    /// Every `SPEECH OUTPUT` line of the debug log so far: when Orca handed the text to its speech server,
    /// and the text.
    pub fn spoken(&self) -> Vec<(SystemTime, String)> {
        let log = std::fs::read_to_string(&self.debug).unwrap_or_default();
        log.lines().filter_map(parse_speech_output).collect()
    }

    /// Whether the debug log has a line containing `text` (e.g. "Interrupting presentation").
    pub fn logged(&self, text: &str) -> bool {
        std::fs::read_to_string(&self.debug)
            .unwrap_or_default()
            .contains(text)
    }

    pub fn check_running(&mut self) {
        self.service.check_running();
    }

    /// Orca's output and the end of its debug log.
    pub fn logs(&self) -> String {
        let debug = std::fs::read_to_string(&self.debug).unwrap_or_default();
        let tail: Vec<&str> = debug.lines().rev().take(80).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!(
            "--- orca output:\n{}\n--- orca debug log (end):\n{}",
            self.service.log(),
            tail.join("\n")
        )
    }
}

/// `19:15:38.851948 - SPEECH OUTPUT: 'A long button label push button.'{…}` → (that time today, UTC; the
/// text between the quotes).
fn parse_speech_output(line: &str) -> Option<(SystemTime, String)> {
    let (clock, rest) = line.split_once(" - SPEECH OUTPUT: '")?;
    // The text, then `'` and the voice settings (`{…}`) when Orca logs them.
    let text = match rest.rfind("'{") {
        Some(end) => &rest[..end],
        None => rest.rsplit_once('\'')?.0,
    }
    .to_owned();
    Some((time_of_day(clock)?, text))
}

/// `HH:MM:SS[.frac]` of today (UTC), or of yesterday when that is in the future.
fn time_of_day(clock: &str) -> Option<SystemTime> {
    let mut parts = clock.split(':');
    let h: u64 = parts.next()?.parse().ok()?;
    let m: u64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    let of_day = Duration::from_secs(h * 3600 + m * 60) + Duration::from_secs_f64(s);
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()?;
    let day = Duration::from_secs(86_400);
    let midnight = Duration::from_secs(now.as_secs() / 86_400 * 86_400);
    let mut at = midnight + of_day;
    // Logged just before midnight, read just after.
    if at > now + Duration::from_secs(3600) {
        at -= day;
    }
    Some(SystemTime::UNIX_EPOCH + at)
}

/// The entries of speech-dispatcher's log (`[Tue Dec  1 22:51:32 2026 : 974838] speechd: message`, a
/// message may go on over several lines) with their times; the server must run with `TZ=UTC`.
pub fn speechd_log_entries(log: &str) -> Vec<(SystemTime, String)> {
    let mut entries: Vec<(SystemTime, String)> = Vec::new();
    for line in log.lines() {
        let head = line
            .strip_prefix('[')
            .and_then(|l| l.split_once("] speechd: "))
            .and_then(|(stamp, message)| {
                let (date, micros) = stamp.split_once(" : ")?;
                let clock = date.split_whitespace().nth(3)?;
                let micros: u64 = micros.trim().parse().ok()?;
                let at = time_of_day(clock)? + Duration::from_micros(micros);
                Some((at, message.to_owned()))
            });
        match (head, entries.last_mut()) {
            (Some(entry), _) => entries.push(entry),
            (None, Some((_, message))) => {
                message.push('\n');
                message.push_str(line);
            }
            (None, None) => {}
        }
    }
    entries
}

/// `at` (wall clock) as an `Instant` of this process's monotonic clock.
pub fn instant_of(at: SystemTime) -> Instant {
    let (now, now_wall) = (Instant::now(), SystemTime::now());
    match now_wall.duration_since(at) {
        Ok(ago) => now.checked_sub(ago).unwrap_or(now),
        Err(ahead) => now + ahead.duration(),
    }
}

/// A GTK 3 window holding one focused button (`gtk_window.py`), for Orca to present.
pub struct GtkWindow {
    service: Service,
}

impl GtkWindow {
    /// Opens the window with `title` and a button labelled `label`; returns once GTK says it has the
    /// keyboard focus. `env`: `DISPLAY` and the session bus (GTK finds the accessibility bus through it).
    pub fn open(dir: &Path, env: &[(String, String)], title: &str, label: &str) -> GtkWindow {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("gtk_window.py");
        let log = dir.join("gtk-window.log");
        let mut env = env.to_vec();
        env.push(("GSETTINGS_BACKEND".into(), "memory".into()));
        // Debian's python3 (python3-gi), whatever `python3` is first on PATH.
        let mut service = Service::spawn(
            "/usr/bin/python3",
            &[&script.display().to_string(), title, label],
            &env,
            log.clone(),
        );
        wait_until("the GTK window to get the focus", || {
            service.check_running();
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("focused")
        });
        GtkWindow { service }
    }

    pub fn log(&self) -> String {
        self.service.log()
    }
}

/// Sends one key press and release to the focused window (`xdotool key`, through XTEST).
pub fn press_key(env: &[(String, String)], key: &str) {
    let status = Command::new(require_program("xdotool"))
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .args(["key", key])
        .status()
        .expect("cannot run xdotool");
    assert!(status.success(), "xdotool key {key} failed");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_orca_speech_lines() {
        let (at, text) = parse_speech_output(
            "19:15:38.851948 - SPEECH OUTPUT: 'A long button label push button.'{'established': False}",
        )
        .unwrap();
        assert_eq!(text, "A long button label push button.");
        let secs = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
            % 86_400.0;
        assert!(
            (secs - (19.0 * 3600.0 + 15.0 * 60.0 + 38.851948)).abs() < 1e-3,
            "{secs}"
        );
        assert!(parse_speech_output("19:15:38.85 - SPEECH: Initializing").is_none());
    }
}
