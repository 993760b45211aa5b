//! Helpers of the daemon tests that start `kazeiad` on a private bus and talk to it as clients do.

use std::collections::HashMap;
use std::io::PipeReader;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use kazeia_spiel::{s16le_to_f32, Chunk, SpielReader};
use kazeia_tests::services::{DbusSession, PipeWire, Service, TempDir};
use kazeia_tests::speaking_model;
use kazeiad::dbus::client::SpeechProxy;
use zbus::wire::Variant;

/// The daemon's binary: the one cargo built for these tests or, in the benchmark examples
/// (`daemon/examples/first_audio`, to which cargo names no binary), one built for them
/// ([`kazeia_tests::kazeiad`]).
pub fn kazeiad() -> String {
    match option_env!("CARGO_BIN_EXE_kazeiad") {
        Some(path) => path.to_owned(),
        None => kazeia_tests::kazeiad().display().to_string(),
    }
}

pub use kazeia_tests::daemon_config::{quick_model, speaking_config, write_config};

/// D-Bus activation files for both of kazeiad's names, starting it with `config`, in `dir/services`
/// (returned, for [`DbusSession::start`]).
pub fn activation_files(dir: &Path, config: &Path) -> PathBuf {
    kazeia_tests::daemon_config::activation_files(dir, &kazeiad(), config)
}

/// `kazeiad` on a private bus, on a config written for the test, its model loaded: where most daemon tests
/// start. Its fields drop in order: the daemon, PipeWire, the bus, then the folder (config, log, model).
pub struct TestDaemon {
    pub service: Service,
    pub pw: Option<PipeWire>,
    pub bus: DbusSession,
    pub dir: TempDir,
}

impl TestDaemon {
    /// The tiny fixture model ([`quick_model`]) on the null sink; `extra` is appended to the config.
    pub fn null(name: &str, extra: &str) -> TestDaemon {
        TestDaemon::setup(name, extra).null()
    }

    /// A model that speaks for seconds ([`speaking_model`]) through a headless PipeWire's null sink.
    pub fn pipewire(name: &str, extra: &str) -> TestDaemon {
        TestDaemon::setup(name, extra).speaking().pipewire()
    }

    /// A daemon to be started in a folder named after `name`, `extra` appended to its config: the tiny
    /// fixture model unless [`Setup::model`] or [`Setup::speaking`] says otherwise, the daemon's environment
    /// the bus's plus what [`Setup::env`] adds; [`Setup::null`] or [`Setup::pipewire`] starts it.
    pub fn setup(name: &str, extra: &str) -> Setup {
        Setup {
            dir: TempDir::new(name),
            model: None,
            weights: None,
            extra: extra.to_owned(),
            env: Vec::new(),
        }
    }

    fn start(setup: Setup, pw: bool, sink: &str) -> TestDaemon {
        let Setup {
            dir,
            model,
            weights,
            extra,
            env: added,
        } = setup;
        let bus = DbusSession::start(None);
        let pw = pw.then(|| PipeWire::start(&bus));
        let config = dir.path().join("kazeia.toml");
        write_config(&config, &model.unwrap_or_else(quick_model), sink, &extra);
        if let Some(weights) = weights {
            let text = std::fs::read_to_string(&config).unwrap();
            let text = text.replacen(
                "[model]\n",
                &format!("[model]\nweights = \"{weights}\"\n"),
                1,
            );
            std::fs::write(&config, text).unwrap();
        }
        let mut env = pw.as_ref().map_or_else(|| bus.env(), PipeWire::env);
        env.extend(added);
        let service = start_daemon(&bus, &env, &config, dir.path().join("kazeiad.log"));
        wait_until_loaded(&bus);
        TestDaemon {
            service,
            pw,
            bus,
            dir,
        }
    }

    /// The config it was started on (`kazeia.toml` in its folder).
    pub fn config(&self) -> PathBuf {
        self.dir.path().join("kazeia.toml")
    }

    /// The PipeWire it plays through (tests started with [`TestDaemon::pipewire`]).
    pub fn pw(&self) -> &PipeWire {
        self.pw.as_ref().expect("a daemon started on PipeWire")
    }
}

/// How a [`TestDaemon`] is to be started (from [`TestDaemon::setup`]).
pub struct Setup {
    dir: TempDir,
    model: Option<PathBuf>,
    weights: Option<String>,
    extra: String,
    env: Vec<(String, String)>,
}

impl Setup {
    /// The test's folder (where the model of [`Setup::speaking`] goes, and the config and log will).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts `model` instead of the tiny fixture one.
    pub fn model(mut self, model: PathBuf) -> Setup {
        self.model = Some(model);
        self
    }

    /// Loads the model's weights in `format` (`[model] weights`: `bf16`, `q8`, …) instead of `auto`.
    pub fn weights(mut self, format: &str) -> Setup {
        self.weights = Some(format.to_owned());
        self
    }

    /// Starts a model that speaks for seconds ([`speaking_model`], made in the test's folder).
    pub fn speaking(self) -> Setup {
        let model = speaking_model(self.dir.path());
        self.model(model)
    }

    /// Adds `key=value` to the daemon's environment.
    pub fn env(mut self, key: &str, value: &str) -> Setup {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Starts it on the null sink, and waits until its model is loaded.
    pub fn null(self) -> TestDaemon {
        TestDaemon::start(self, false, "null")
    }

    /// Starts it through a headless PipeWire's null sink, and waits until its model is loaded.
    pub fn pipewire(self) -> TestDaemon {
        TestDaemon::start(self, true, "pipewire")
    }

    /// Starts it writing its audio to the WAV file `wav`, and waits until its model is loaded.
    pub fn wav(self, wav: &Path) -> TestDaemon {
        TestDaemon::start(self, false, &format!("wav:{}", wav.display()))
    }
}

/// Starts `kazeiad --config CONFIG` and waits until it owns its name (its model may still be loading).
pub fn start_daemon(
    bus: &DbusSession,
    env: &[(String, String)],
    config: &Path,
    log: PathBuf,
) -> Service {
    let config = config.display().to_string();
    let daemon = Service::spawn(&kazeiad(), &["--config", &config], env, log);
    assert!(
        name_appears(bus, "org.kazeia.Speech"),
        "kazeiad never appeared on the bus:\n{}",
        daemon.log()
    );
    daemon
}

/// Whether `name` is owned on the bus within a minute.
pub fn name_appears(bus: &DbusSession, name: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !busctl(bus, &["status", name]).status.success() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Waits until the daemon's `State` is no longer `loading` (it owns its name before its model is loaded).
pub fn wait_until_loaded(bus: &DbusSession) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while state(bus).contains("loading") {
        assert!(Instant::now() < deadline, "the model never loaded");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The daemon's `State` property as busctl prints it (`s "idle"`), empty if the call failed. Where the bus
/// can activate the daemon, the call starts it.
pub fn state(bus: &DbusSession) -> String {
    let property = [
        "get-property",
        "org.kazeia.Speech",
        "/org/kazeia/Speech",
        "org.kazeia.Speech1",
        "State",
    ];
    let out = busctl(bus, &property);
    if !out.status.success() {
        return String::new();
    }
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `busctl ARGS` on the test bus.
pub fn busctl(bus: &DbusSession, args: &[&str]) -> std::process::Output {
    Command::new("busctl")
        .arg(format!("--address={}", bus.address()))
        .args(args)
        .output()
        .expect("busctl (package systemd) is needed")
}

/// `busctl call` on Kazeia's interface; Ok(stdout) or Err(stderr).
pub fn call(bus: &DbusSession, method: &str, args: &[&str]) -> Result<String, String> {
    let mut all = vec![
        "call",
        "org.kazeia.Speech",
        "/org/kazeia/Speech",
        "org.kazeia.Speech1",
        method,
    ];
    all.extend_from_slice(args);
    let out = busctl(bus, &all);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// `Speak` through busctl; the id.
pub fn speak(bus: &DbusSession, text: &str) -> u64 {
    let out = call(bus, "Speak", &["sa{sv}", text, "0"]).expect("Speak failed");
    out.strip_prefix("t ").unwrap().parse().unwrap()
}

/// A new client on the test bus: a connection whose socket another process connected (see
/// [`connect_as_new_process`]), so the daemon, which counts clients by process, sees a client of its own.
pub async fn connect(bus: &DbusSession) -> zbus::Connection {
    connect_as_new_process(bus.address()).await
}

/// Another connection of this test process: several of them are one client.
pub async fn connect_in_this_process(bus: &DbusSession) -> zbus::Connection {
    zbus::connection::Builder::address(bus.address())
        .build()
        .await
        .expect("cannot connect to the test bus")
}

/// A connection to the bus at `address` (`unix:path=…` or `unix:abstract=…`) that the bus sees as another
/// process's: the socket is connected by a child forked for that alone, and the bus takes the peer's
/// credentials (`SO_PEERCRED`, what `GetConnectionUnixProcessID` answers) from the process that called
/// `connect()`. The child exits at once; this process speaks D-Bus on the socket.
pub async fn connect_as_new_process(address: &str) -> zbus::Connection {
    let stream = socket_connected_by_a_child(address);
    zbus::connection::Builder::unix_stream(stream)
        .build()
        .await
        .expect("cannot connect to the test bus")
}

fn socket_connected_by_a_child(address: &str) -> std::os::unix::net::UnixStream {
    use std::os::fd::FromRawFd;
    let transport = address.split(';').next().unwrap();
    let params = transport
        .strip_prefix("unix:")
        .expect("a unix: bus address");
    let (abstract_name, path) = params
        .split(',')
        .find_map(|kv| match kv.split_once('=') {
            Some(("abstract", v)) => Some((true, v)),
            Some(("path", v)) => Some((false, v)),
            _ => None,
        })
        .expect("a path= or abstract= bus address");
    // SAFETY: a zeroed sockaddr_un is valid; the path is copied within its bounds (checked).
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let start = usize::from(abstract_name);
    assert!(
        start + path.len() < addr.sun_path.len(),
        "bus path too long"
    );
    for (i, b) in path.bytes().enumerate() {
        addr.sun_path[start + i] = b as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + start + path.len()) as libc::socklen_t;
    // SAFETY: socket/fork/connect/_exit/waitpid with valid arguments; between fork and _exit the child
    // makes only async-signal-safe system calls (the parent has threads).
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let pid = libc::fork();
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let ok = libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), len) == 0;
            libc::_exit(if ok { 0 } else { 1 });
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child could not connect to {address}"
        );
        std::os::unix::net::UnixStream::from_raw_fd(fd)
    }
}

/// A new client of its own ([`connect`]) and its proxy of Kazeia's interface.
pub async fn client(bus: &DbusSession) -> (zbus::Connection, SpeechProxy<'static>) {
    let connection = connect(bus).await;
    let api = proxy(&connection).await;
    (connection, api)
}

/// Another connection of this test process ([`connect_in_this_process`]) and its proxy of Kazeia's interface.
pub async fn client_in_this_process(bus: &DbusSession) -> (zbus::Connection, SpeechProxy<'static>) {
    let connection = connect_in_this_process(bus).await;
    let api = proxy(&connection).await;
    (connection, api)
}

/// A proxy of Kazeia's interface on `connection`, its properties read anew each time.
pub async fn proxy(connection: &zbus::Connection) -> SpeechProxy<'static> {
    SpeechProxy::builder(connection)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
        .unwrap()
}

/// `Speak` options with this priority.
pub fn priority(p: &str) -> HashMap<&'static str, Variant<'static>> {
    HashMap::from([("priority", Variant::from(p.to_owned()))])
}

/// What Orca 43 (`speechdispatcherfactory.py`, `_speak`) sends for `text`: a mark `start:end` (character
/// offsets) before every word, `<`, `>`, `&` escaped, in `<speak>`.
pub fn orca_ssml(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut ssml = String::from("<speak>");
    let mut i = 0;
    while i < chars.len() {
        if !chars[i].is_whitespace() && (i == 0 || chars[i - 1].is_whitespace()) {
            let end = (i..chars.len())
                .find(|&j| chars[j].is_whitespace())
                .unwrap_or(chars.len());
            ssml += &format!("<mark name=\"{i}:{end}\"/>");
        }
        match chars[i] {
            '<' => ssml += "&lt;",
            '>' => ssml += "&gt;",
            '&' => ssml += "&amp;",
            c => ssml.push(c),
        }
        i += 1;
    }
    ssml + "</speak>"
}

/// Orca's default voice settings as speech-dispatcher hands them to the module before each message (Orca's
/// rate 50, pitch 5, gain 10 become SSIP rate 2, pitch 10, volume 100; punctuation "most").
pub const ORCA_SET: &str =
    "SET\nrate=2\npitch=10\npitch_range=0\nvolume=100\npunctuation_mode=most\n\
                        spelling_mode=off\ncap_let_recogn=none\nvoice=male1\nlanguage=en\n.\n";

/// `Finished` signals as they come, kept by id so that waiting for one never loses another.
pub struct Finishes {
    pub stream: kazeiad::dbus::client::FinishedStream,
    pub seen: HashMap<u64, String>,
}

impl Finishes {
    pub async fn new(proxy: &SpeechProxy<'_>) -> Self {
        Finishes {
            stream: proxy.receive_finished().await.unwrap(),
            seen: HashMap::new(),
        }
    }

    /// Waits for `Finished(id, reason)`; the reason.
    pub async fn of(&mut self, id: u64, timeout: Duration) -> String {
        tokio::time::timeout(timeout, async {
            loop {
                if let Some(reason) = self.seen.remove(&id) {
                    return reason;
                }
                self.next().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no Finished for {id} within {timeout:?}"))
    }

    /// Speaks `text` through `api` as a `message` (which cancels nothing), and waits for its `Finished`; the
    /// reason.
    pub async fn message(
        &mut self,
        api: &SpeechProxy<'_>,
        text: &str,
        timeout: Duration,
    ) -> String {
        let id = api.speak(text, priority("message")).await.unwrap();
        self.of(id, timeout).await
    }

    /// Takes the next signal into `seen`.
    pub async fn next(&mut self) {
        let signal = self.stream.next().await.expect("the signal stream ended");
        let args = signal.args().unwrap();
        let previous = self.seen.insert(args.id, args.reason.clone());
        assert!(previous.is_none(), "two Finished for {}", args.id);
    }

    /// Waits until a `Finished` with `reason` came; its id.
    pub async fn any_with(&mut self, reason: &str, timeout: Duration) -> u64 {
        tokio::time::timeout(timeout, async {
            loop {
                if let Some((&id, _)) = self.seen.iter().find(|(_, r)| r.as_str() == reason) {
                    self.seen.remove(&id);
                    return id;
                }
                self.next().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no Finished({reason}) within {timeout:?}"))
    }
}

pub async fn spiel_proxy(connection: &zbus::Connection) -> zbus::Proxy<'static> {
    zbus::Proxy::new(
        connection,
        "org.kazeia.Speech.Provider",
        "/org/kazeia/Speech/Provider",
        "org.freedesktop.Speech.Provider",
    )
    .await
    .unwrap()
}

/// Calls Spiel `Synthesize` with the descriptor `fd` (whatever it is) and default voice settings.
pub async fn synthesize_to(
    connection: &zbus::Connection,
    fd: std::os::fd::BorrowedFd<'_>,
    text: &str,
    ssml: bool,
) -> zbus::Result<()> {
    spiel_proxy(connection)
        .await
        .call(
            "Synthesize",
            &(zbus::Fd::from(fd), text, "", 1.0f64, 1.0f64, ssml, ""),
        )
        .await
}

/// Calls Spiel `Synthesize` and returns the read end of the pipe, unread.
pub async fn synthesize(
    connection: &zbus::Connection,
    text: &str,
    ssml: bool,
) -> zbus::Result<PipeReader> {
    let (reader, writer) = std::io::pipe().unwrap();
    let fd: std::os::fd::OwnedFd = writer.into();
    let sent = synthesize_to(connection, fd.as_fd(), text, ssml).await;
    drop(fd);
    sent.map(|()| reader)
}

/// Reads a whole Spiel stream (a pipe, a socket); the samples, none if it had no header. `pace`: bytes a
/// second the reader takes at most (a client playing as it reads), none: as fast as it comes.
pub fn read_stream(reader: impl std::io::Read, pace: Option<f64>) -> Vec<f32> {
    let start = Instant::now();
    let Ok(mut stream) = SpielReader::new(reader) else {
        return Vec::new();
    };
    let mut samples = Vec::new();
    let mut bytes = 0usize;
    while let Some(chunk) = stream.next_chunk().expect("well-formed Spiel stream") {
        if let Chunk::Audio(pcm) = chunk {
            bytes += pcm.len();
            samples.extend(s16le_to_f32(&pcm));
            if let Some(rate) = pace {
                let due = Duration::from_secs_f64(bytes as f64 / rate);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        }
    }
    samples
}

/// `Synthesize` and the whole stream, read as fast as it comes.
pub async fn spiel(connection: &zbus::Connection, text: &str) -> zbus::Result<Vec<f32>> {
    let reader = synthesize(connection, text, false).await?;
    Ok(
        tokio::task::spawn_blocking(move || read_stream(reader, None))
            .await
            .unwrap(),
    )
}

/// Waits until `ready` holds, asking again every `every`; panics after `limit` with what `failure` says
/// (called then, so it may read a log).
pub async fn wait_for(
    limit: Duration,
    every: Duration,
    mut ready: impl AsyncFnMut() -> bool,
    failure: impl Fn() -> String,
) {
    let deadline = Instant::now() + limit;
    while !ready().await {
        assert!(Instant::now() < deadline, "{}", failure());
        tokio::time::sleep(every).await;
    }
}

/// Seconds of `samples` (at `rate`) in 5 ms windows with a sample louder than `threshold`.
pub fn loud_seconds(samples: &[f32], rate: u32, threshold: f32) -> f64 {
    let window = rate as usize / 200;
    let loud = samples
        .chunks(window)
        .filter(|w| w.iter().any(|s| s.abs() > threshold))
        .count();
    (loud * window) as f64 / rate as f64
}

/// A memory figure of a process's `/proc/PID/status` (`VmRSS`, `VmHWM`, …), in KiB.
pub fn memory_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/PID/status"))
}

/// The daemon's peak resident memory (VmHWM), in MiB.
pub fn peak_rss_mib(pid: u32) -> f64 {
    memory_kib(pid, "VmHWM") as f64 / 1024.0
}

/// Every `Finished` signal, drained as it comes by a task of its own: a signal stream left unread fills
/// up and then holds up the whole connection, method replies included.
#[derive(Clone)]
pub struct Collector {
    pub seen: Arc<Mutex<HashMap<u64, String>>>,
    /// Ids that got a second `Finished`.
    pub twice: Arc<Mutex<Vec<u64>>>,
    /// The draining task holds the connection: it ends with the last clone, so the client can leave.
    _task: Arc<AbortOnDrop>,
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Collector {
    pub async fn start(proxy: &SpeechProxy<'_>) -> Self {
        let seen: Arc<Mutex<HashMap<u64, String>>> = Arc::default();
        let twice: Arc<Mutex<Vec<u64>>> = Arc::default();
        let mut stream = proxy.receive_finished().await.unwrap();
        let (s, t) = (seen.clone(), twice.clone());
        let task = tokio::spawn(async move {
            while let Some(signal) = stream.next().await {
                let args = signal.args().unwrap();
                if s.lock()
                    .unwrap()
                    .insert(args.id, args.reason.clone())
                    .is_some()
                {
                    t.lock().unwrap().push(args.id);
                }
            }
        });
        Collector {
            seen,
            twice,
            _task: Arc::new(AbortOnDrop(task.abort_handle())),
        }
    }

    pub fn len(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Waits for `Finished(id, reason)`; the reason.
    pub async fn of(&self, id: u64, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(reason) = self.seen.lock().unwrap().get(&id) {
                return reason.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no Finished for {id} within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
