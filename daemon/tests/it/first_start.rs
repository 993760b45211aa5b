//! First start and offline start, on real services: a private `dbus-daemon` starts `kazeiad` by activation
//! while its model is still to be downloaded from a local hub server (`kazeia_tests::hub_server`) that holds
//! the weights back. The daemon owns its name at once, says `loading` with the download's progress, answers
//! `Speak` with `NotReady` (not a bus timeout), and speaks once the download ends; started again, it uses the
//! snapshot with no network call; a model it cannot get leaves it up, `failed`, with the reason.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kazeia_tests::hub_server::{Hub, REPO};
use kazeia_tests::services::{DbusSession, TempDir};
use kazeiad::dbus::client::SpeechProxy;
use zbus::wire::Variant;

use crate::common;

const KAZEIAD: &str = env!("CARGO_BIN_EXE_kazeiad");

/// Activation files for both names, running `kazeiad --config CONFIG` with `env`.
fn activation_dir(dir: &Path, config: &Path, env: &[(&str, String)]) -> std::path::PathBuf {
    let vars: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let daemon = format!("/usr/bin/env {} {KAZEIAD}", vars.join(" "));
    kazeia_tests::daemon_config::activation_files(dir, &daemon, config)
}

/// What points a daemon at the test's hub: the hub, the hub cache and the weight cache (both in `dir`).
fn hub_env(dir: &Path, hub: &Hub) -> [(&'static str, String); 3] {
    [
        ("HF_ENDPOINT", hub.endpoint.clone()),
        ("HF_HUB_CACHE", dir.join("hub").display().to_string()),
        (
            "KAZEIA_CACHE_DIR",
            dir.join("weights").display().to_string(),
        ),
    ]
}

fn write_config(path: &Path, model: &str) {
    std::fs::write(
        path,
        format!(
            "[model]\npath = \"{model}\"\ndownload = true\n[audio]\nsink = \"null\"\n[generation]\nmax_frames = 6\n\
             [threads]\ntalker = 1\ncode_predictor = 1\ndecoder = 1\n"
        ),
    )
    .unwrap();
}

/// A user's first start: a local hub serving the tiny model (its weights held back while `held`), a config
/// naming the hub's repository (downloads allowed) and a bus that activates kazeiad on it with the hub's
/// environment; kazeiad starts at the first call. The fields drop in order: the bus (and the daemon it
/// started), the hub, the folder.
struct FirstStart {
    bus: DbusSession,
    hub: Hub,
    config: PathBuf,
    dir: TempDir,
}

fn first_start(label: &str, held: bool) -> FirstStart {
    let dir = TempDir::new(label);
    let hub = Hub::start();
    if held {
        hub.state().hold = Some("model.safetensors".into());
    }
    let config = dir.path().join("kazeia.toml");
    write_config(&config, REPO);
    let env = hub_env(dir.path(), &hub);
    let bus = DbusSession::start(Some(&activation_dir(dir.path(), &config, &env)));
    FirstStart {
        bus,
        hub,
        config,
        dir,
    }
}

/// `Reload()` called from a task of its own: it is answered only once the load in progress ends.
fn reload_in_background(
    proxy: &SpeechProxy<'static>,
) -> tokio::task::JoinHandle<zbus::Result<String>> {
    let proxy = proxy.clone();
    tokio::spawn(async move { proxy.reload().await })
}

async fn wait_state(proxy: &SpeechProxy<'_>, want: impl Fn(&str) -> bool, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(state) = proxy.state().await {
            if want(&state) {
                return state;
            }
        }
        assert!(Instant::now() < deadline, "never {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn speak(proxy: &SpeechProxy<'_>, text: &str) -> zbus::Result<u64> {
    proxy.speak(text, HashMap::<&str, Variant<'_>>::new()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_start_downloads_while_serving_and_an_offline_start_needs_no_network() {
    let FirstStart {
        bus,
        hub,
        dir: _dir,
        ..
    } = first_start("daemon-first-start", true);
    let (connection, proxy) = common::client_in_this_process(&bus).await;

    // Activation by the first call: answered at once although the weights have not come.
    let state = proxy
        .state()
        .await
        .expect("activation answers while the model downloads");
    assert_eq!(state, "loading");
    let deadline = Instant::now() + Duration::from_secs(30);
    let progress = loop {
        let p = proxy.load_progress().await.unwrap();
        if p.contains("downloading") && p.contains("model.safetensors") {
            break p;
        }
        assert!(Instant::now() < deadline, "no download progress: {p:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("LoadProgress while held: {progress}");
    // A request now waits a few seconds, then gets NotReady saying why: never a bus timeout.
    let asked = Instant::now();
    match speak(&proxy, "Too early.").await {
        Err(zbus::Error::MethodError(name, Some(message), _)) => {
            assert_eq!(name.as_str(), "org.kazeia.Speech1.Error.NotReady");
            assert!(message.contains("downloading"), "{message}");
        }
        other => panic!("expected NotReady, got {other:?}"),
    }
    assert!(asked.elapsed() < Duration::from_secs(20));

    hub.release();
    wait_state(&proxy, |s| s == "idle", "idle after the download").await;
    assert_eq!(proxy.load_progress().await.unwrap(), "");
    speak(&proxy, "Now it speaks.")
        .await
        .expect("Speak once loaded");
    let fetched = hub.state().requests.len();
    assert!(fetched > 0);

    // Started again with the snapshot complete: no request reaches the hub at all.
    let dbus = zbus::fdo::DBusProxy::new(&connection).await.unwrap();
    let name: zbus::names::BusName<'_> = "org.kazeia.Speech".try_into().unwrap();
    let pid = dbus
        .get_connection_unix_process_id(name.clone())
        .await
        .unwrap();
    // SAFETY: a signal to the daemon this test's bus started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while dbus.name_has_owner(name.clone()).await.unwrap() {
        assert!(Instant::now() < deadline, "the daemon did not stop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let state = wait_state(&proxy, |s| s == "idle", "idle on the second start").await;
    assert_eq!(state, "idle");
    speak(&proxy, "Offline start.")
        .await
        .expect("Speak on the second start");
    assert_eq!(
        hub.state().requests.len(),
        fetched,
        "the second start called the hub"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_cannot_be_had_leaves_the_daemon_up_and_saying_why() {
    let dir = TempDir::new("daemon-no-model");
    let config = dir.path().join("kazeia.toml");
    write_config(&config, "Kazeia/not-cached");
    let env = [
        ("HF_HUB_OFFLINE", "1".to_owned()),
        ("HF_HUB_CACHE", dir.path().join("hub").display().to_string()),
    ];
    let bus = DbusSession::start(Some(&activation_dir(dir.path(), &config, &env)));
    let (_connection, proxy) = common::client_in_this_process(&bus).await;
    wait_state(&proxy, |s| s == "failed", "failed").await;
    let progress = proxy.load_progress().await.unwrap();
    assert!(
        progress.starts_with("failed:") && progress.contains("HF_HUB_OFFLINE"),
        "{progress}"
    );
    match speak(&proxy, "Anyone there?").await {
        Err(zbus::Error::MethodError(name, Some(message), _)) => {
            assert_eq!(name.as_str(), "org.kazeia.Speech1.Error.NotReady");
            assert!(message.contains("could not be loaded"), "{message}");
        }
        other => panic!("expected NotReady, got {other:?}"),
    }
}

/// `sd_kazeia` on a pipe, driven line by line as speech-dispatcher drives it; its stderr (the module log)
/// goes to a file.
struct Module {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    log: std::path::PathBuf,
}

impl Module {
    fn start(bus: &DbusSession, log: std::path::PathBuf) -> Module {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let mut child = Command::new(kazeia_tests::sd_kazeia())
            .envs(bus.env())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.split(b'\n').map_while(Result::ok) {
                if tx
                    .send(String::from_utf8_lossy(&line).into_owned())
                    .is_err()
                {
                    break;
                }
            }
        });
        Module {
            child,
            stdin,
            lines,
            log,
        }
    }

    /// Sends INIT and asserts its answer: a line that starts with `described` within 2 s, then `status`
    /// within 1 s more.
    fn init_answers(&mut self, described: &str, status: &str) {
        self.send(&["INIT"]);
        let said = self.line(Duration::from_secs(2));
        assert!(said.starts_with(described), "{said}");
        assert_eq!(self.line(Duration::from_secs(1)), status);
    }

    fn send(&mut self, lines: &[&str]) {
        use std::io::Write;
        for line in lines {
            writeln!(self.stdin, "{line}").unwrap();
        }
        self.stdin.flush().unwrap();
    }

    /// The next line, within `within`.
    fn line(&self, within: Duration) -> String {
        self.lines.recv_timeout(within).unwrap_or_else(|_| {
            panic!(
                "no line from sd_kazeia within {within:?}; its log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            )
        })
    }

    /// Sends `lines`; asserts the replies are `want`, each within a second of the one before.
    fn exchange(&mut self, lines: &[&str], want: &[&str]) {
        self.send(lines);
        for w in want {
            assert_eq!(self.line(Duration::from_secs(1)), *w);
        }
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The screen reader's path on a first start: speech-dispatcher starts `sd_kazeia` while kazeiad is still
/// getting its model (held back 40 s, longer than the 30 s the module once waited for voices). No command
/// waits more than a second on the daemon, each message meanwhile is refused at once with the reason in the
/// module's log, and the first message once the model is ready is spoken, with nothing restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_module_answers_at_once_while_the_daemon_loads_and_speaks_once_ready() {
    let FirstStart { bus, hub, dir, .. } = first_start("module-first-start", true);
    let mut module = Module::start(&bus, dir.path().join("kazeia-module.log"));

    // INIT starts the daemon, which answers while it downloads: the module loads.
    module.init_answers("299-kazeia: speech provider", "299 OK LOADED SUCCESSFULLY");
    module.exchange(
        &["AUDIO", "audio_output_method=server", "."],
        &[
            "207 OK RECEIVING AUDIO SETTINGS",
            "203 OK AUDIO INITIALIZED",
        ],
    );
    module.exchange(&["LIST VOICES"], &["304 CANT LIST VOICES"]);
    let message = ["SPEAK", "<speak>Too early.</speak>", "."];
    let held = Instant::now();
    while held.elapsed() < Duration::from_secs(40) {
        let asked = Instant::now();
        module.exchange(
            &message,
            &["202 OK RECEIVING MESSAGE", "301 ERROR CANT SPEAK"],
        );
        module.send(&["STOP"]);
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "{:?}",
            asked.elapsed()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let log = std::fs::read_to_string(&module.log).unwrap();
    assert!(
        log.contains("message not spoken") && log.contains("downloading model.safetensors"),
        "the module's log does not say why:\n{log}"
    );

    hub.release();
    let (_connection, proxy) = common::client_in_this_process(&bus).await;
    wait_state(&proxy, |s| s == "idle", "idle after the download").await;
    module.exchange(
        &["SPEAK", "<speak>Now it speaks.</speak>", "."],
        &["202 OK RECEIVING MESSAGE", "200 OK SPEAKING", "701 BEGIN"],
    );
    let mut audio = 0;
    loop {
        let line = module.line(Duration::from_secs(60));
        if line == "705 AUDIO" {
            audio += 1;
        }
        assert_ne!(line, "703 STOP");
        if line == "702 END" {
            break;
        }
    }
    assert!(audio > 0, "no audio before the end");
    module.exchange(&["QUIT"], &["210 OK QUIT"]);
}

/// kazeiad on `config` with `env` besides the bus's, its log in `dir`; returns once it owns its name.
fn start_logged(
    bus: &DbusSession,
    dir: &Path,
    config: &Path,
    env: &[(&str, String)],
) -> kazeia_tests::services::Service {
    let mut all = bus.env();
    all.extend(env.iter().map(|(k, v)| (k.to_string(), v.clone())));
    common::start_daemon(bus, &all, config, dir.join("kazeiad.log"))
}

async fn name_owned(connection: &zbus::Connection, name: &str) -> bool {
    let dbus = zbus::fdo::DBusProxy::new(connection).await.unwrap();
    dbus.name_has_owner(name.try_into().unwrap()).await.unwrap()
}

/// Loads run one at a time and off the main loop. A reload that downloads (held back) leaves the daemon
/// answering: another `Reload()` and SIGHUP meanwhile start no second download, and SIGTERM ends it at once.
/// Then, started again while its first load downloads: a `Reload()`, SIGHUP and a saved file start no second
/// load beside it (one GET of the weights, one model loaded) and are answered once it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loads_run_one_at_a_time_and_sigterm_is_answered_during_a_download() {
    let dir = TempDir::new("daemon-one-load");
    let hub = Hub::start();
    hub.state().hold = Some("model.safetensors".into());
    let config = dir.path().join("kazeia.toml");
    write_config(&config, &common::quick_model().display().to_string());
    let env = hub_env(dir.path(), &hub);
    let bus = DbusSession::start(None);
    let (connection, proxy) = common::client_in_this_process(&bus).await;
    let downloads = || hub.gets("model.safetensors").len();

    let mut daemon = start_logged(&bus, dir.path(), &config, &env);
    wait_state(&proxy, |s| s == "idle", "idle on the local model").await;
    write_config(&config, REPO);
    common::wait_for(
        Duration::from_secs(30),
        Duration::from_millis(20),
        async || downloads() != 0,
        || "the reload did not download".into(),
    )
    .await;
    let reload = reload_in_background(&proxy);
    // SAFETY: kill(2) takes no pointers and has no memory-safety preconditions.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGHUP) };
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(downloads(), 1, "a second download beside the first");
    assert_eq!(
        proxy.state().await.unwrap(),
        "idle",
        "the running model stays"
    );
    // SAFETY: as above.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGTERM) };
    let asked = Instant::now();
    while name_owned(&connection, "org.kazeia.Speech").await {
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "SIGTERM not answered during a reload: {}",
            daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(reload);
    daemon.terminate();

    // Started on the hub model: its first load downloads (the rest of the weights), held back.
    let before = downloads();
    let mut daemon = start_logged(&bus, dir.path(), &config, &env);
    common::wait_for(
        Duration::from_secs(30),
        Duration::from_millis(20),
        async || downloads() != before,
        || "no download".into(),
    )
    .await;
    let reload = reload_in_background(&proxy);
    // SAFETY: as above.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGHUP) };
    write_config(&config, REPO);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(downloads(), before + 1, "a second download");
    assert!(
        !reload.is_finished(),
        "Reload() answered before the load it waited for"
    );
    hub.release();
    wait_state(&proxy, |s| s == "idle", "idle after the download").await;
    let summary = reload
        .await
        .unwrap()
        .expect("Reload() after the first load");
    assert_eq!(summary, "no change", "{}", daemon.log());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = daemon.log();
    assert_eq!(log.matches("loaded in").count(), 1, "{log}");
    assert_eq!(downloads(), before + 1);
    daemon.check_running();
}

async fn config_problem(proxy: &SpeechProxy<'_>) -> String {
    proxy.config_problem().await.unwrap()
}

/// A configuration file is applied only once it is finished and valid: an empty file (an editor truncates
/// before it writes) and a half-written one are never applied, however long they stay, and say why in
/// `ConfigProblem`; the running settings stay and speak. A finished file is then applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_written_configuration_is_never_applied() {
    let dir = TempDir::new("daemon-half-written");
    let config = dir.path().join("kazeia.toml");
    let quick = common::quick_model().display().to_string();
    write_config(&config, &quick);
    let bus = DbusSession::start(None);
    let daemon = start_logged(&bus, dir.path(), &config, &[]);
    let (_connection, proxy) = common::client_in_this_process(&bus).await;
    wait_state(&proxy, |s| s == "idle", "idle").await;
    assert_eq!(config_problem(&proxy).await, "");
    let whole = std::fs::read_to_string(&config).unwrap();
    // Cut inside the model's path, an unterminated string (a cut at a fixed share of the file could fall
    // between two lines, a valid file, depending on where the checkout is).
    let half = whole.find("path = \"").unwrap() + "path = \"/".len();
    for (written, why) in [
        (String::new(), "is empty"),
        (whole[..half].to_owned(), "invalid configuration"),
    ] {
        std::fs::write(&config, &written).unwrap();
        common::wait_for(
            Duration::from_secs(10),
            Duration::from_millis(50),
            async || config_problem(&proxy).await.contains(why),
            || format!("{written:?} not refused: {}", daemon.log()),
        )
        .await;
        // Long after: still the running model and settings, speaking.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(proxy.model().await.unwrap(), quick);
        speak(&proxy, "Still here.")
            .await
            .expect("speaks meanwhile");
    }
    let other = kazeia_tests::fixtures_dir()
        .join("lm/shape_1b7")
        .display()
        .to_string();
    write_config(&config, &other);
    let deadline = Instant::now() + Duration::from_secs(30);
    while proxy.model().await.unwrap() != other {
        assert!(
            Instant::now() < deadline,
            "the finished file was not applied"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(config_problem(&proxy).await, "");
}

/// A daemon started on a broken file serves with the settings last applied from it (or, with none kept, the
/// defaults), says why in `ConfigProblem` and the log, and speaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_configuration_at_start_serves_on_the_last_good_settings() {
    let dir = TempDir::new("daemon-broken-start");
    let config = dir.path().join("kazeia.toml");
    let quick = common::quick_model().display().to_string();
    write_config(&config, &quick);
    let cache = (
        "XDG_CACHE_HOME",
        dir.path().join("cache").display().to_string(),
    );
    let bus = DbusSession::start(None);
    let (_connection, proxy) = common::client_in_this_process(&bus).await;
    let mut daemon = start_logged(&bus, dir.path(), &config, std::slice::from_ref(&cache));
    wait_state(&proxy, |s| s == "idle", "idle").await;
    daemon.terminate();

    std::fs::write(&config, "[model]\npath = \"unterminated\n").unwrap();
    let daemon = start_logged(&bus, dir.path(), &config, std::slice::from_ref(&cache));
    wait_state(&proxy, |s| s == "idle", "idle on the last good settings").await;
    assert_eq!(proxy.model().await.unwrap(), quick);
    assert!(config_problem(&proxy)
        .await
        .contains("invalid configuration"));
    speak(&proxy, "Spoken anyway.").await.expect("speaks");
    assert!(
        daemon.log().contains("settings last applied from it"),
        "{}",
        daemon.log()
    );
    drop(daemon);

    // No copy kept for this file: the defaults (whose model cannot be had offline), still serving.
    let other = dir.path().join("other.toml");
    std::fs::write(&other, "[queue]\nmax_utterances = \"many\"\n").unwrap();
    let offline = [
        cache,
        ("HF_HUB_OFFLINE", "1".to_owned()),
        ("HF_HUB_CACHE", dir.path().join("hub").display().to_string()),
    ];
    let daemon = start_logged(&bus, dir.path(), &other, &offline);
    wait_state(&proxy, |s| s == "failed", "failed on the defaults' model").await;
    assert!(config_problem(&proxy)
        .await
        .contains("invalid configuration"));
    assert!(
        daemon.log().contains("built-in defaults"),
        "{}",
        daemon.log()
    );
}

/// A load that failed (the model not there yet) is tried again by itself, with the time of the next try in
/// `LoadProgress`, and the daemon speaks once it succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_load_is_tried_again() {
    let dir = TempDir::new("daemon-retry");
    let config = dir.path().join("kazeia.toml");
    let model = dir.path().join("model");
    write_config(&config, &model.display().to_string());
    let bus = DbusSession::start(None);
    let daemon = start_logged(&bus, dir.path(), &config, &[]);
    let (_connection, proxy) = common::client_in_this_process(&bus).await;
    wait_state(&proxy, |s| s == "failed", "failed").await;
    let progress = proxy.load_progress().await.unwrap();
    assert!(progress.contains("tried again in"), "{progress}");
    std::os::unix::fs::symlink(common::quick_model(), &model).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while proxy.state().await.unwrap() != "idle" {
        assert!(
            Instant::now() < deadline,
            "never tried again: {}",
            daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    speak(&proxy, "Found it.")
        .await
        .expect("speaks after the retry");
}

/// By default the daemon downloads nothing by itself: a model not on the machine leaves it `failed`, saying
/// which command gets it, with no request to the hub; `sd_kazeia`'s INIT then fails, so speech-dispatcher
/// keeps speaking with its other modules. Once the model is in the cache (as `kazeia model download` puts
/// it), a `Reload()` loads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_model_on_disk_the_daemon_downloads_nothing_and_the_module_steps_aside() {
    let FirstStart {
        bus,
        hub,
        config,
        dir,
    } = first_start("daemon-no-download", false);
    // Not started yet (the first call activates it): its file says nothing of downloads.
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("download = true\n", "")).unwrap();
    let cache = dir.path().join("hub");
    let (_connection, proxy) = common::client_in_this_process(&bus).await;
    wait_state(&proxy, |s| s == "failed", "failed without a model").await;
    let progress = proxy.load_progress().await.unwrap();
    assert!(
        progress.contains("kazeia model download Kazeia/tiny"),
        "{progress}"
    );
    assert!(hub.state().requests.is_empty(), "the daemon called the hub");

    let mut module = Module::start(&bus, dir.path().join("kazeia-module.log"));
    module.init_answers(
        "399-kazeiad has no model it can load",
        "399 ERR CANT INIT MODULE",
    );

    let settings = kazeia_engine::hub::HubSettings {
        endpoint: hub.endpoint.clone(),
        cache_dir: cache.clone(),
        offline: false,
        token: None,
    };
    tokio::task::spawn_blocking(move || {
        kazeia_engine::hub::resolve(REPO, &settings, &mut |_: &str, _: u64, _: Option<u64>| {})
    })
    .await
    .unwrap()
    .expect("the download");
    proxy
        .reload()
        .await
        .expect("Reload() once the model is there");
    assert_eq!(proxy.state().await.unwrap(), "idle");
    speak(&proxy, "Here now.").await.expect("speaks");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The model's files rewritten in place while the daemon runs (a `cp` over them, a package upgrade): no
/// SIGBUS, whether idle or speaking; the daemon loads the model again and speaks with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_files_rewritten_while_running_are_loaded_again() {
    let dir = TempDir::new("daemon-model-rewritten");
    let model = dir.path().join("model");
    copy_dir(&common::quick_model(), &model);
    let config = dir.path().join("kazeia.toml");
    write_config(&config, &model.display().to_string());
    let bus = DbusSession::start(None);
    let mut daemon = start_logged(&bus, dir.path(), &config, &[]);
    let (_connection, proxy) = common::client_in_this_process(&bus).await;
    wait_state(&proxy, |s| s == "idle", "idle").await;
    let mut finishes = common::Finishes::new(&proxy).await;
    let weights = model.join("model.safetensors");
    let original = std::fs::read(&weights).unwrap();
    for round in 0..2 {
        // Round 0: rewritten while idle; round 1: while an utterance is being generated.
        let id = if round == 1 {
            Some(
                speak(
                    &proxy,
                    &"A long sentence to keep the daemon busy. ".repeat(8),
                )
                .await
                .unwrap(),
            )
        } else {
            None
        };
        // Truncated first, as `cp` and most installers do, then written back.
        std::fs::write(&weights, b"").unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::fs::write(&weights, &original).unwrap();
        if let Some(id) = id {
            let reason = finishes.of(id, Duration::from_secs(60)).await;
            assert!(reason == "done" || reason.starts_with("error:"), "{reason}");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while daemon
            .log()
            .matches("the model's files changed on disk")
            .count()
            <= round
        {
            daemon.check_running();
            assert!(Instant::now() < deadline, "no reload: {}", daemon.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        wait_state(&proxy, |s| s == "idle", "idle after the reload").await;
        let id = speak(&proxy, "Still speaking.").await.unwrap();
        assert_eq!(
            finishes.of(id, Duration::from_secs(60)).await,
            "done",
            "{}",
            daemon.log()
        );
    }
    daemon.check_running();
}
