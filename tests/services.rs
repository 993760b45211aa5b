//! Real services for tests, each private to the test that starts it: a session `dbus-daemon`, a headless
//! PipeWire (pipewire + WirePlumber + a null sink, optionally pipewire-pulse) and a recorder of what
//! reaches the sink. Everything lives in its own temporary directory and is killed on drop.
//!
//! Tests run in parallel threads of one process, so nothing here touches the process environment:
//! children get their variables explicitly (`env()`). A service dies with the thread that started it
//! (PR_SET_PDEATHSIG), so start and use it within one test.
//!
//! ```no_run
//! use kazeia_tests::services::{DbusSession, PipeWire, Recorder};
//! let bus = DbusSession::start(None);
//! let pw = PipeWire::start(&bus);
//! let rec = Recorder::start(&pw);
//! std::process::Command::new("pw-play").envs(pw.env()).args(["--target", pw.sink_name(), "x.wav"]);
//! let audio = rec.stop();
//! assert!(audio.peak() > 0.4);
//! ```

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a service may take to become ready before the test fails.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The Debian package that provides each program the services run.
fn package_of(program: &str) -> &'static str {
    match program {
        "dbus-daemon" => "dbus-daemon",
        "pipewire" | "pw-cli" | "pw-record" | "pw-metadata" | "pw-play" => "pipewire-bin",
        "dbus-send" => "dbus-bin",
        "wireplumber" => "wireplumber",
        "pipewire-pulse" => "pipewire-pulse",
        "stdbuf" => "coreutils",
        "chrt" => "util-linux",
        "speech-dispatcher" | "spd-say" => "speech-dispatcher",
        "Xvfb" => "xvfb",
        "orca" => "orca",
        "xdotool" => "xdotool",
        "/usr/bin/python3" => "python3-gi",
        "dpkg-deb" => "dpkg",
        _ => "(unknown; see tools/deps.sh)",
    }
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// A program's full path, or a panic that names the package to install.
pub fn require_program(program: &str) -> PathBuf {
    which(program).unwrap_or_else(|| {
        panic!(
            "`{program}` is not installed: install the Debian package `{}` (tools/deps.sh installs \
             everything the tests need)",
            package_of(program)
        )
    })
}

/// A fresh directory under the system temporary directory, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        // Short: unix socket paths inside must stay under 108 bytes.
        let path = std::env::temp_dir().join(format!(
            "kz-{label}-{}-{}-{nanos:x}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("cannot create a temporary directory");
        set_mode(&path, 0o700);
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    /// Removes the directory, unless its test is failing: the services' and the daemon's logs in it are then what
    /// tells why (a failure seen once in CI is rarely seen again on demand), so their last lines are printed
    /// with the failure and the directory is kept.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test failed: its files are kept in {}", self.0.display());
            let mut logs: Vec<PathBuf> = std::fs::read_dir(&self.0)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "log"))
                .collect();
            logs.sort();
            for log in logs {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                eprintln!("--- last lines of {}:", log.display());
                for line in &lines[lines.len().saturating_sub(40)..] {
                    eprintln!("{line}");
                }
            }
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .expect("cannot set permissions");
}

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
    fn prctl(option: i32, ...) -> i32;
    fn getppid() -> i32;
}
const PR_SET_PDEATHSIG: i32 = 1;
const SIGINT: i32 = 2;
const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;
const SIGCONT: i32 = 18;
const SIGSTOP: i32 = 19;

/// A child started in its own process group, so that it and anything it spawned can be killed at once.
pub struct Service {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Service {
    /// Starts `program` with exactly `env` (plus PATH), stdout and stderr to `log`.
    pub fn spawn(program: &str, args: &[&str], env: &[(String, String)], log: PathBuf) -> Service {
        let path = require_program(program);
        let out = std::fs::File::create(&log).expect("cannot create a log file");
        let child = command(&path, args, env)
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        Service {
            name: program.to_owned(),
            child,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Panics with the log if the service has exited.
    pub fn check_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "{} exited ({status}); its log:\n{}",
                self.name,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM to the group, SIGKILL after a second, and reaps the child.
    pub fn terminate(&mut self) {
        terminate_group(&mut self.child, SIGTERM);
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// Sends `signal` to the child's process group, then SIGKILL to the group if the child is still there
/// after a second (the stragglers too).
fn terminate_group(child: &mut Child, signal: i32) -> Option<std::process::ExitStatus> {
    let group = -(child.id() as i32);
    if let Ok(Some(status)) = child.try_wait() {
        // SAFETY: kill(2) takes no pointers and has no memory-safety preconditions; `group` is the child's group.
        unsafe { kill(group, SIGKILL) };
        return Some(status);
    }
    // SAFETY: kill(2) takes no pointers and has no memory-safety preconditions; `group` is the child's group.
    unsafe { kill(group, signal) };
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            // SAFETY: as above.
            unsafe { kill(group, SIGKILL) };
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: as above.
    unsafe { kill(group, SIGKILL) };
    child.wait().ok()
}

/// A command with a clean environment (PATH and `env` only), in its own process group, killed when the
/// thread that starts it ends: a test process that dies without unwinding (a broken stdout pipe, a
/// double panic) leaves no services behind. So a service lives no longer than the test thread that
/// started it.
fn command(program: &Path, args: &[&str], env: &[(String, String)]) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .process_group(0);
    let parent = std::process::id() as i32;
    // SAFETY: between fork and exec; prctl and getppid are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if prctl(PR_SET_PDEATHSIG, SIGKILL as std::ffi::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the prctl.
            if getppid() != parent {
                return Err(std::io::Error::other("the test process is gone"));
            }
            Ok(())
        });
    }
    cmd
}

/// `command` (a clean environment, its own process group), under `chrt -f` (real-time) where that is
/// allowed. For PipeWire clients whose main loop moves the audio (pw-record, pw-play): at normal priority on
/// a busy machine they miss cycles, and the recording loses pieces that were played.
pub fn realtime_command(program: &Path, args: &[&str], env: &[(String, String)]) -> Command {
    static CHRT: OnceLock<Option<PathBuf>> = OnceLock::new();
    let chrt = CHRT.get_or_init(|| {
        let chrt = which("chrt")?;
        let allowed = command(&chrt, &["-f", "10", "true"], &[])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        allowed.then_some(chrt)
    });
    match chrt {
        Some(chrt) => {
            let program = program.display().to_string();
            let mut all = vec!["-f", "10", program.as_str()];
            all.extend_from_slice(args);
            command(chrt, &all, env)
        }
        None => command(program, args, env),
    }
}

/// Polls `ready` (every 5 ms) until it holds; panics after `READY_TIMEOUT` with `what`.
pub fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + READY_TIMEOUT;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Tries `attempt` every `every` until it gives `Ok` or `limit` has passed; the last try's result, so that
/// a caller's failure message can say what was seen instead (`.unwrap_or_else(|seen| panic!(…))`).
pub fn retry<T, E>(
    limit: Duration,
    every: Duration,
    mut attempt: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let deadline = Instant::now() + limit;
    loop {
        let tried = attempt();
        if tried.is_ok() || Instant::now() >= deadline {
            return tried;
        }
        std::thread::sleep(every);
    }
}

/// Waits at most `limit` for `child` to exit: its status, or `None` when it was still running (it is killed
/// and reaped then).
pub fn wait_or_kill(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A private session bus.
pub struct DbusSession {
    dir: TempDir,
    runtime_dir: PathBuf,
    address: String,
    child: Child,
}

impl DbusSession {
    /// Starts `dbus-daemon` with a session configuration that lets anyone own any name, and activates
    /// services from `service_dir` if given. It also makes a runtime directory, given to activated services
    /// as `XDG_RUNTIME_DIR`; a [`PipeWire`] on this bus listens there, so they find it.
    pub fn start(service_dir: Option<&Path>) -> DbusSession {
        DbusSession::start_with_env(service_dir, &[])
    }

    /// [`DbusSession::start`] with `env` added to what activated services get (a user's `HOME`, as a login
    /// session's bus has it).
    pub fn start_with_env(service_dir: Option<&Path>, env: &[(String, String)]) -> DbusSession {
        let program = require_program("dbus-daemon");
        let dir = TempDir::new("bus");
        let runtime_dir = dir.path().join("run");
        std::fs::create_dir(&runtime_dir).expect("cannot create the runtime directory");
        set_mode(&runtime_dir, 0o700);
        let service_dir = service_dir
            .map(|d| {
                format!(
                    "  <servicedir>{}</servicedir>\n",
                    xml_escape(&d.display().to_string())
                )
            })
            .unwrap_or_default();
        let config = format!(
            "<!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN\"\n \
             \"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n\
             <busconfig>\n  <type>session</type>\n  <listen>unix:tmpdir={}</listen>\n{service_dir}  \
             <policy context=\"default\">\n    <allow send_destination=\"*\" eavesdrop=\"true\"/>\n    \
             <allow eavesdrop=\"true\"/>\n    <allow own=\"*\"/>\n  </policy>\n</busconfig>\n",
            xml_escape(&dir.path().display().to_string())
        );
        let config_path = dir.path().join("bus.conf");
        std::fs::write(&config_path, config).expect("cannot write the bus configuration");
        let mut env = env.to_vec();
        env.push((
            "XDG_RUNTIME_DIR".to_owned(),
            runtime_dir.display().to_string(),
        ));
        let mut child = command(
            &program,
            &[
                &format!("--config-file={}", config_path.display()),
                "--nofork",
                "--print-address=1",
            ],
            &env,
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start dbus-daemon: {e}"));
        // The address is printed once the bus listens.
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let address = match rx.recv_timeout(READY_TIMEOUT) {
            Ok(line) if !line.trim().is_empty() => line.trim().to_owned(),
            _ => {
                terminate_group(&mut child, SIGKILL);
                panic!("dbus-daemon did not print its address");
            }
        };
        DbusSession {
            dir,
            runtime_dir,
            address,
            child,
        }
    }

    /// `DBUS_SESSION_BUS_ADDRESS` for clients.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The runtime directory activated services get as `XDG_RUNTIME_DIR`.
    pub fn runtime_dir(&self) -> &Path {
        &self.runtime_dir
    }

    /// The bus's own temporary directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What a child needs to use this bus.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("DBUS_SESSION_BUS_ADDRESS".into(), self.address.clone()),
            (
                "XDG_RUNTIME_DIR".into(),
                self.runtime_dir.display().to_string(),
            ),
        ]
    }
}

impl Drop for DbusSession {
    fn drop(&mut self) {
        terminate_group(&mut self.child, SIGTERM);
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Headless PipeWire: the daemon, WirePlumber (it links streams; it needs the session bus) and a mono
/// 48 kHz null sink that is the default sink.
pub struct PipeWire {
    // Dropped in this order: the reverse of starting.
    pulse: Option<Service>,
    wireplumber: Service,
    pipewire: Service,
    env: Vec<(String, String)>,
    runtime_dir: PathBuf,
    sink: String,
    dir: TempDir,
}

/// The null sink's name.
pub const SINK_NAME: &str = "kazeia-test-sink";

impl PipeWire {
    /// Starts pipewire and WirePlumber on `bus`, creates the null sink and returns once WirePlumber has
    /// made it the default sink (so streams get linked from then on).
    pub fn start(bus: &DbusSession) -> PipeWire {
        let dir = TempDir::new("pw");
        let runtime_dir = bus.runtime_dir().to_path_buf();
        let mut env = bus.env();
        env.extend(
            [
                ("PIPEWIRE_RUNTIME_DIR", runtime_dir.display().to_string()),
                // A fresh configuration and state: no saved default sink or volume from elsewhere.
                ("HOME", dir.path().join("home").display().to_string()),
                (
                    "XDG_CONFIG_HOME",
                    dir.path().join("config").display().to_string(),
                ),
                (
                    "XDG_STATE_HOME",
                    dir.path().join("state").display().to_string(),
                ),
                (
                    "XDG_DATA_HOME",
                    dir.path().join("data").display().to_string(),
                ),
            ]
            .map(|(k, v)| (k.to_owned(), v)),
        );
        let socket = runtime_dir.join("pipewire-0");
        let mut pipewire = Service::spawn("pipewire", &[], &env, dir.path().join("pipewire.log"));
        wait_until("the pipewire socket", || {
            pipewire.check_running();
            socket.exists()
        });
        let mut wireplumber =
            Service::spawn("wireplumber", &[], &env, dir.path().join("wireplumber.log"));
        // WirePlumber's default-nodes module publishes the "default" metadata once it runs.
        wait_until("WirePlumber", || {
            wireplumber.check_running();
            run_output("pw-metadata", &["-n", "default", "0"], &env).contains("Found \"default\"")
        });
        let node = format!(
            "{{ factory.name=support.null-audio-sink node.name={SINK_NAME} \
             node.description=\"Kazeia test sink\" media.class=Audio/Sink object.linger=true \
             audio.position=[MONO] audio.rate=48000 }}"
        );
        // pw-cli reports nothing either way; the sink becoming the default below is the proof.
        run_output("pw-cli", &["create-node", "adapter", &node], &env);
        wait_until("WirePlumber to make the null sink the default", || {
            wireplumber.check_running();
            run_output(
                "pw-metadata",
                &["-n", "default", "0", "default.audio.sink"],
                &env,
            )
            .contains(SINK_NAME)
        });
        PipeWire {
            pulse: None,
            wireplumber,
            pipewire,
            env,
            runtime_dir,
            sink: SINK_NAME.to_owned(),
            dir,
        }
    }

    /// Also starts pipewire-pulse (speech-dispatcher 0.11 plays through PulseAudio) and waits for its
    /// socket; `env()` then includes `PULSE_SERVER`.
    pub fn with_pulse(mut self) -> PipeWire {
        let socket = self.runtime_dir.join("pulse").join("native");
        let mut pulse = Service::spawn(
            "pipewire-pulse",
            &[],
            &self.env,
            self.dir.path().join("pipewire-pulse.log"),
        );
        wait_until("the pipewire-pulse socket", || {
            pulse.check_running();
            socket.exists()
        });
        self.env
            .push(("PULSE_SERVER".into(), format!("unix:{}", socket.display())));
        self.pulse = Some(pulse);
        self
    }

    /// What a child needs to play here: XDG_RUNTIME_DIR, PIPEWIRE_RUNTIME_DIR, DBUS_SESSION_BUS_ADDRESS,
    /// HOME and XDG_{CONFIG,STATE,DATA}_HOME (private), PULSE_SERVER with pulse.
    pub fn env(&self) -> Vec<(String, String)> {
        self.env.clone()
    }

    /// The PipeWire socket, for in-process clients (libpipewire's `remote.name`).
    pub fn socket(&self) -> PathBuf {
        self.runtime_dir.join("pipewire-0")
    }

    pub fn sink_name(&self) -> &str {
        &self.sink
    }

    pub fn pipewire_pid(&self) -> u32 {
        self.pipewire.pid()
    }

    /// The services' logs, for assertion messages.
    pub fn logs(&self) -> String {
        let mut all = format!(
            "--- pipewire\n{}\n--- wireplumber\n{}",
            self.pipewire.log(),
            self.wireplumber.log()
        );
        if let Some(pulse) = &self.pulse {
            all += &format!("\n--- pipewire-pulse\n{}", pulse.log());
        }
        all
    }

    /// Stops (SIGSTOP) or continues (SIGCONT) the PipeWire server, to test clients of a hung server.
    pub fn freeze_server(&self, frozen: bool) {
        // SAFETY: kill(2) takes no pointers and has no memory-safety preconditions.
        unsafe {
            kill(
                self.pipewire.pid() as i32,
                if frozen { SIGSTOP } else { SIGCONT },
            )
        };
    }

    /// Kills the PipeWire server (WirePlumber and pipewire-pulse go with it), to test clients that lose it.
    pub fn kill_server(&mut self) {
        if let Some(mut pulse) = self.pulse.take() {
            pulse.terminate();
        }
        self.wireplumber.terminate();
        self.pipewire.terminate();
    }
}

/// Runs a short command with `env` and returns stdout and stderr together (empty if it could not run).
fn run_output(program: &str, args: &[&str], env: &[(String, String)]) -> String {
    let path = require_program(program);
    match command(&path, args, env).output() {
        Ok(out) => {
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr)
        }
        Err(_) => String::new(),
    }
}

/// Records what is played to the null sink: `pw-record` on the sink's monitor, mono f32 at 48 kHz, raw on
/// its stdout. Each piece is stamped with the time it arrived, so tests can tell when audio was heard.
pub struct Recorder {
    child: Child,
    reader: Option<JoinHandle<()>>,
    pieces: Pieces,
}

/// What pw-record wrote, read by read, with when each read returned.
type Pieces = Arc<Mutex<Vec<(Instant, Vec<f32>)>>>;

/// The recorder's sample rate.
pub const RECORD_RATE: u32 = 48_000;

impl Recorder {
    /// Starts recording the null sink and returns once audio (silence) arrives.
    pub fn start(pw: &PipeWire) -> Recorder {
        let stdbuf = require_program("stdbuf");
        let pw_record = require_program("pw-record");
        let rate = RECORD_RATE.to_string();
        // stdbuf -o0: pw-record writes each cycle's audio as it comes, not in 4 KiB stdio blocks.
        let mut child = realtime_command(
            &stdbuf,
            &[
                "-o0",
                &pw_record.display().to_string(),
                "--target",
                pw.sink_name(),
                "-P",
                "{ stream.capture.sink=true }",
                "--rate",
                &rate,
                "--channels",
                "1",
                "--format",
                "f32",
                // The cycle Kazeia asks for: the graph runs as it would for a user, and time stamps come
                // every 10 ms.
                "--latency",
                "10ms",
                "-",
            ],
            &pw.env(),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start pw-record: {e}"));
        let mut stdout = child.stdout.take().expect("piped stdout");
        let pieces: Pieces = Arc::default();
        let reader = {
            let pieces = pieces.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                let mut partial: Vec<u8> = Vec::new();
                loop {
                    let n = match stdout.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    let at = Instant::now();
                    partial.extend_from_slice(&buf[..n]);
                    let whole = partial.len() / 4 * 4;
                    let samples = partial[..whole]
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect();
                    partial.drain(..whole);
                    pieces.lock().unwrap().push((at, samples));
                }
            })
        };
        let mut recorder = Recorder {
            child,
            reader: Some(reader),
            pieces,
        };
        wait_until("pw-record to capture", || {
            if let Ok(Some(status)) = recorder.child.try_wait() {
                panic!("pw-record exited ({status}) before recording");
            }
            !recorder.pieces.lock().unwrap().is_empty()
        });
        recorder
    }

    /// Samples recorded so far.
    pub fn len(&self) -> usize {
        self.pieces.lock().unwrap().iter().map(|p| p.1.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// While recording: when the first read that arrived at or after `since` with a sample louder than
    /// `threshold` arrived.
    pub fn sound_since(&self, since: Instant, threshold: f32) -> Option<Instant> {
        let pieces = self.pieces.lock().unwrap();
        pieces
            .iter()
            .find(|(at, p)| *at >= since && p.iter().any(|s| s.abs() > threshold))
            .map(|(at, _)| *at)
    }

    /// While recording: when the last read with a sample louder than `threshold` arrived.
    pub fn last_sound(&self, threshold: f32) -> Option<Instant> {
        let pieces = self.pieces.lock().unwrap();
        pieces
            .iter()
            .rev()
            .find(|(_, p)| p.iter().any(|s| s.abs() > threshold))
            .map(|(at, _)| *at)
    }

    /// Stops recording (SIGINT, as pw-record expects) and returns everything recorded.
    pub fn stop(mut self) -> Recording {
        terminate_group(&mut self.child, SIGINT);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let pieces = std::mem::take(&mut *self.pieces.lock().unwrap());
        let mut samples = Vec::new();
        let mut arrivals = Vec::new();
        for (at, piece) in pieces {
            samples.extend_from_slice(&piece);
            arrivals.push((samples.len(), at));
        }
        Recording {
            rate: RECORD_RATE,
            samples,
            arrivals,
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        terminate_group(&mut self.child, SIGKILL);
    }
}

/// What a [`Recorder`] captured.
pub struct Recording {
    pub rate: u32,
    pub samples: Vec<f32>,
    /// (samples received so far, when): one entry per read from pw-record.
    arrivals: Vec<(usize, Instant)>,
}

impl Recording {
    pub fn peak(&self) -> f32 {
        self.samples.iter().fold(0.0, |m, s| m.max(s.abs()))
    }

    /// Index of the first and one past the last sample louder than `threshold`.
    pub fn sound_span(&self, threshold: f32) -> Option<(usize, usize)> {
        let first = self.samples.iter().position(|s| s.abs() > threshold)?;
        let last = self.samples.iter().rposition(|s| s.abs() > threshold)?;
        Some((first, last + 1))
    }

    /// Seconds from the first to the end of the last sample louder than `threshold` (0 if none).
    pub fn sound_duration(&self, threshold: f32) -> f64 {
        self.sound_span(threshold)
            .map_or(0.0, |(a, b)| (b - a) as f64 / self.rate as f64)
    }

    /// Spans of sound separated by more than `gap` seconds of silence, as (start, end) sample indices.
    pub fn sound_spans(&self, threshold: f32, gap: f64) -> Vec<(usize, usize)> {
        let gap = (gap * self.rate as f64) as usize;
        let mut spans: Vec<(usize, usize)> = Vec::new();
        for (i, s) in self.samples.iter().enumerate() {
            if s.abs() <= threshold {
                continue;
            }
            match spans.last_mut() {
                Some(span) if i - span.1 <= gap => span.1 = i + 1,
                _ => spans.push((i, i + 1)),
            }
        }
        spans
    }

    /// When the sample at `index` reached the test: the arrival of the read that held it, at most one
    /// graph cycle (10 ms) after it was played. `None` past the end.
    pub fn arrival(&self, index: usize) -> Option<Instant> {
        self.arrivals
            .iter()
            .find(|(end, _)| *end > index)
            .map(|(_, at)| *at)
    }

    /// Frequency of the dominant tone in `samples[range]`, from its zero crossings over the whole span:
    /// strict, so a click (extra crossings) or a dropout (missing ones) moves it.
    pub fn frequency(&self, start: usize, end: usize) -> f64 {
        let part = &self.samples[start..end];
        let crossings = part
            .windows(2)
            .filter(|w| (w[0] < 0.0) != (w[1] < 0.0))
            .count();
        crossings as f64 / 2.0 / (part.len() as f64 / self.rate as f64)
    }

    /// Where a tone of `hz` in `samples[range]` is not regular: (ms from `start`, samples) of each period
    /// between upward zero crossings more than a tenth off `rate / hz` — a dropout, a click, a lost cycle. For
    /// failure messages: it says where the audio went wrong.
    pub fn irregular_periods(&self, start: usize, end: usize, hz: f64) -> Vec<(f64, usize)> {
        let expected = self.rate as f64 / hz;
        let upward: Vec<usize> = self.samples[start..end]
            .windows(2)
            .enumerate()
            .filter(|(_, w)| w[0] < 0.0 && w[1] >= 0.0)
            .map(|(i, _)| i)
            .collect();
        upward
            .windows(2)
            .map(|w| (w[0], w[1] - w[0]))
            .filter(|&(_, period)| (period as f64 - expected).abs() > expected / 10.0)
            .map(|(at, period)| (at as f64 * 1e3 / self.rate as f64, period))
            .collect()
    }

    /// Pitch of the dominant tone in `samples[range]`: the rate over the mean of the middle half of the
    /// periods between upward zero crossings. Unlike [`Recording::frequency`] it ignores a dropout or a
    /// click, for audio the test's own tools (pw-play) play on a loaded machine.
    pub fn pitch(&self, start: usize, end: usize) -> f64 {
        let part = &self.samples[start..end];
        let upward: Vec<usize> = part
            .windows(2)
            .enumerate()
            .filter(|(_, w)| w[0] < 0.0 && w[1] >= 0.0)
            .map(|(i, _)| i)
            .collect();
        let mut periods: Vec<usize> = upward.windows(2).map(|w| w[1] - w[0]).collect();
        if periods.is_empty() {
            return 0.0;
        }
        periods.sort_unstable();
        // The periods are whole samples (109 or 110 for 440 Hz at 48 kHz): a mean, of the middle half so
        // that a dropout's long period and a click's short ones fall outside it.
        let quarter = periods.len() / 4;
        let middle = &periods[quarter..periods.len() - quarter];
        let mean = middle.iter().sum::<usize>() as f64 / middle.len() as f64;
        self.rate as f64 / mean
    }

    /// Root mean square of `samples[range]`.
    pub fn rms(&self, start: usize, end: usize) -> f32 {
        let part = &self.samples[start..end];
        (part.iter().map(|s| s * s).sum::<f32>() / part.len().max(1) as f32).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn irregular_periods_find_a_lost_cycle_and_nothing_in_a_clean_tone() {
        let tone: Vec<f32> = (0..48_000)
            .map(|i| (2.0 * std::f64::consts::PI * 440.0 * i as f64 / 48_000.0).sin() as f32 * 0.5)
            .collect();
        let recording = |samples: Vec<f32>| Recording {
            rate: 48_000,
            samples,
            arrivals: Vec::new(),
        };
        let clean = recording(tone.clone());
        assert!(clean.irregular_periods(0, 48_000, 440.0).is_empty());
        // 256 samples (a graph quantum at 48 kHz) lost half a second in.
        let mut lost = tone;
        lost.drain(24_000..24_256);
        let irregular = recording(lost).irregular_periods(0, 47_744, 440.0);
        assert_eq!(irregular.len(), 1, "{irregular:?}");
        assert!((irregular[0].0 - 500.0).abs() < 3.0, "{irregular:?}");
    }

    #[test]
    fn bus_activates_from_its_service_dir() {
        let services = TempDir::new("svc");
        std::fs::write(
            services.path().join("org.kazeia.HarnessTest.service"),
            "[D-BUS Service]\nName=org.kazeia.HarnessTest\nExec=/bin/false\n",
        )
        .unwrap();
        let bus = DbusSession::start(Some(services.path()));
        let listed = run_output(
            "dbus-send",
            &[
                &format!("--bus={}", bus.address()),
                "--print-reply",
                "--dest=org.freedesktop.DBus",
                "/org/freedesktop/DBus",
                "org.freedesktop.DBus.ListActivatableNames",
            ],
            &[],
        );
        assert!(listed.contains("org.kazeia.HarnessTest"), "{listed}");
    }

    /// A 16-bit mono WAV file.
    fn write_wav(path: &Path, rate: u32, samples: &[f32]) {
        let data: Vec<u8> = samples
            .iter()
            .flat_map(|s| ((s * 32767.0) as i16).to_le_bytes())
            .collect();
        let mut out = b"RIFF".to_vec();
        out.extend_from_slice(&(36 + data.len() as u32).to_le_bytes());
        out.extend_from_slice(b"WAVEfmt \x10\0\0\0\x01\0\x01\0");
        out.extend_from_slice(&rate.to_le_bytes());
        out.extend_from_slice(&(rate * 2).to_le_bytes());
        out.extend_from_slice(b"\x02\0\x10\0data");
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(&data);
        std::fs::write(path, out).unwrap();
    }

    #[test]
    fn recorder_hears_what_pw_play_plays_and_pulse_takes_clients() {
        let bus = DbusSession::start(None);
        let pw = PipeWire::start(&bus).with_pulse();
        let dir = TempDir::new("tone");
        let wav = dir.path().join("tone.wav");
        let tone: Vec<f32> = (0..24_000)
            .map(|i| 0.5 * (2.0 * std::f32::consts::PI * 440.0 * i as f32 / 48_000.0).sin())
            .collect();
        write_wav(&wav, 48_000, &tone);
        let rec = Recorder::start(&pw);
        let played = realtime_command(
            &require_program("pw-play"),
            &["--target", pw.sink_name(), &wav.display().to_string()],
            &pw.env(),
        )
        .status()
        .unwrap();
        assert!(played.success());
        let rec = rec.stop();
        let (start, end) = rec.sound_span(0.05).expect("nothing recorded");
        assert!((rec.sound_duration(0.05) - 0.5).abs() < 0.05);
        assert!((rec.peak() - 0.5).abs() < 0.01, "peak {}", rec.peak());
        assert!((rec.rms(start, end) - 0.5 / 2f32.sqrt()).abs() < 0.01);
        let pitch = rec.pitch(start, end);
        assert!((pitch - 440.0).abs() < 1.0, "pitch {pitch}");
        assert!(rec.arrival(start).unwrap() <= rec.arrival(end - 1).unwrap());

        let pulse = pw
            .env()
            .into_iter()
            .find(|(k, _)| k == "PULSE_SERVER")
            .expect("PULSE_SERVER in env()")
            .1;
        let socket = pulse.strip_prefix("unix:").unwrap();
        std::os::unix::net::UnixStream::connect(socket).expect("pipewire-pulse takes clients");
    }
}
