//! First start and offline start, on real services: a private `dbus-daemon` starts `kazeiad` by activation
//! while its model is still to be downloaded from a local hub server (`kazeia_tests::hub_server`) that holds
//! the weights back. The daemon owns its name at once, says `loading` with the download's progress, answers
//! `Speak` with `NotReady` (not a bus timeout), and speaks once the download ends; started again, it uses the
//! snapshot with no network call; a model it cannot get leaves it up, `failed`, with the reason.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use kazeia_tests::hub_server::{Hub, REPO};
use kazeia_tests::services::{DbusSession, TempDir};
use kazeiad::dbus::client::SpeechProxy;
use zbus::wire::Variant;

const KAZEIAD: &str = env!("CARGO_BIN_EXE_kazeiad");

/// Activation files for both names, running `kazeiad --config CONFIG` with `env`.
fn activation_dir(dir: &Path, config: &Path, env: &[(&str, String)]) -> std::path::PathBuf {
    let services = dir.join("services");
    std::fs::create_dir_all(&services).unwrap();
    let vars: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    for name in ["org.kazeia.Speech", "org.kazeia.Speech.Provider"] {
        std::fs::write(
            services.join(format!("{name}.service")),
            format!(
                "[D-BUS Service]\nName={name}\nExec=/usr/bin/env {} {KAZEIAD} --config {}\n",
                vars.join(" "),
                config.display()
            ),
        )
        .unwrap();
    }
    services
}

fn write_config(path: &Path, model: &str) {
    std::fs::write(
        path,
        format!(
            "[model]\npath = \"{model}\"\n[audio]\nsink = \"null\"\n[generation]\nmax_frames = 6\n\
             [threads]\ntalker = 1\ncode_predictor = 1\ndecoder = 1\n"
        ),
    )
    .unwrap();
}

async fn proxy(connection: &zbus::Connection) -> SpeechProxy<'static> {
    SpeechProxy::builder(connection)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
        .unwrap()
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
    let dir = TempDir::new("daemon-first-start");
    let hub = Hub::start();
    hub.state().hold = Some("model.safetensors".into());
    let cache = dir.path().join("hub");
    let config = dir.path().join("kazeia.toml");
    write_config(&config, REPO);
    let env = [
        ("HF_ENDPOINT", hub.endpoint.clone()),
        ("HF_HUB_CACHE", cache.display().to_string()),
        (
            "KAZEIA_CACHE_DIR",
            dir.path().join("weights").display().to_string(),
        ),
    ];
    let bus = DbusSession::start(Some(&activation_dir(dir.path(), &config, &env)));
    let connection = zbus::connection::Builder::address(bus.address())
        .build()
        .await
        .unwrap();
    let proxy = proxy(&connection).await;

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
    let connection = zbus::connection::Builder::address(bus.address())
        .build()
        .await
        .unwrap();
    let proxy = proxy(&connection).await;
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
