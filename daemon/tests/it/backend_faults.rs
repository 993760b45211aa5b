//! A backend that fails while the daemon speaks, on real services: a private `dbus-daemon`, `kazeiad` with its
//! decoder on the real `faulty` test plugin (`tests/faulty-plugin`, dlopen'ed; its op lists fail after
//! `KAZEIA_FAULTY_AFTER`), and Spiel clients reading the stream. The utterance is spoken whole, the stage moves
//! to the CPU with one warning, later utterances are the same audio, and a reload tries the plugin again.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use kazeia_spiel::{s16le_to_f32, Chunk, SpielReader};
use kazeia_tests::services::{DbusSession, Service, TempDir};
use kazeia_tests::speaking_model;
use kazeiad::dbus::client::SpeechProxy;

const KAZEIAD: &str = env!("CARGO_BIN_EXE_kazeiad");

/// Spiel `Synthesize`, the whole stream read: the samples.
async fn spiel(connection: &zbus::Connection, text: &str) -> Vec<f32> {
    let (reader, writer) = std::io::pipe().unwrap();
    let proxy = zbus::Proxy::new(
        connection,
        "org.kazeia.Speech.Provider",
        "/org/kazeia/Speech/Provider",
        "org.freedesktop.Speech.Provider",
    )
    .await
    .unwrap();
    let fd: std::os::fd::OwnedFd = writer.into();
    let read = std::thread::spawn(move || {
        let mut stream = SpielReader::new(reader).expect("a Spiel stream");
        let mut samples = Vec::new();
        while let Some(chunk) = stream.next_chunk().expect("well-formed Spiel stream") {
            if let Chunk::Audio(pcm) = chunk {
                samples.extend(s16le_to_f32(&pcm));
            }
        }
        samples
    });
    proxy
        .call::<_, _, ()>(
            "Synthesize",
            &(zbus::Fd::from(&fd), text, "", 1.0f64, 1.0f64, false, ""),
        )
        .await
        .expect("Synthesize");
    drop(fd);
    tokio::task::spawn_blocking(move || read.join().unwrap())
        .await
        .unwrap()
}

async fn backends(proxy: &SpeechProxy<'_>) -> HashMap<String, String> {
    proxy.backends().await.unwrap()
}

fn warnings(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("runs on the CPU until the next reload"))
        .collect()
}

async fn wait_until_loaded(proxy: &SpeechProxy<'_>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    // Not on the bus yet (an error), or loading.
    while proxy.state().await.map_or(true, |s| s == "loading") {
        assert!(Instant::now() < deadline, "the model never loaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A named weight format: `auto` would time a few frames at load, on the faulty decoder too, and so spend
/// some of the lists the fault is counted in (the test counts from the warm-up).
fn write_config(path: &Path, model: &Path, plugin_dir: &Path) {
    std::fs::write(
        path,
        format!(
            "[model]\npath = \"{}\"\nweights = \"bf16\"\n[audio]\nsink = \"null\"\n[generation]\ngreedy = true\n\
             [stream]\nfirst_chunk_frames = 1\nchunk_frames = 2\n\
             [threads]\ntalker = 1\ncode_predictor = 1\ndecoder = 1\n\
             [backends]\ndecoder = \"faulty\"\nplugin_path = [\"{}\"]\n",
            model.display(),
            plugin_dir.display()
        ),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decoder_plugin_that_fails_mid_utterance_falls_back_and_the_utterance_is_spoken_whole() {
    let dir = TempDir::new("daemon-faults");
    let model = speaking_model(dir.path());
    let plugin = kazeia_tests::faulty_plugin();
    let config = dir.path().join("kazeia.toml");
    write_config(&config, &model, plugin.parent().unwrap());
    let bus = DbusSession::start(None);
    let log = dir.path().join("kazeiad.log");
    // The warm-up runs at most 4 decoder lists (3 frames: the first chunk's three, the stages before the
    // vocoder and its two parts, then one); the first utterance's lists fail from its third on (its first
    // chunk's second part, or a later chunk), after audio went out.
    let mut env = bus.env();
    env.push(("KAZEIA_FAULTY_AFTER".into(), "6".into()));
    env.push((
        "KAZEIA_CACHE_DIR".into(),
        dir.path().join("cache").display().to_string(),
    ));
    let mut daemon = Service::spawn(
        KAZEIAD,
        &["--config", &config.display().to_string()],
        &env,
        log.clone(),
    );
    let connection = zbus::connection::Builder::address(bus.address())
        .build()
        .await
        .unwrap();
    // Uncached: each read asks the daemon.
    let proxy = SpeechProxy::builder(&connection)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
        .unwrap();
    wait_until_loaded(&proxy).await;
    assert_eq!(backends(&proxy).await["decoder"], "faulty");
    assert!(warnings(&daemon.log()).is_empty(), "{}", daemon.log());

    // A client that caches properties learns of the fallback from PropertiesChanged.
    let watching = SpeechProxy::new(&connection).await.unwrap();
    let mut backends_changed = watching.receive_backends_changed().await;

    let text = "Hello world, this is a test of a failing device.";
    let first = spiel(&connection, text).await;
    daemon.check_running();
    let seconds = first.len() as f64 / 24000.0;
    assert!(seconds > 1.0, "only {seconds} s");
    let logged = daemon.log();
    let warned = warnings(&logged);
    assert_eq!(warned.len(), 1, "{logged}");
    assert!(
        warned[0].contains("decoder") && warned[0].contains("injected fault"),
        "{}",
        warned[0]
    );
    assert_eq!(
        backends(&proxy).await["decoder"],
        "cpu (fallback from faulty after a failure)"
    );
    let changed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let change = backends_changed
                .next()
                .await
                .expect("the signal stream ended");
            let now = change.get().await.unwrap();
            if now["decoder"] != "faulty" {
                return now;
            }
        }
    })
    .await
    .expect("no PropertiesChanged for Backends after the fallback");
    assert_eq!(
        changed["decoder"],
        "cpu (fallback from faulty after a failure)"
    );

    // The next utterance runs on the CPU from its start: the same audio, so the first was neither cut nor
    // repeated where the fault hit.
    let second = spiel(&connection, text).await;
    assert_eq!(second.len(), first.len());
    assert_eq!(second, first);
    assert_eq!(warnings(&daemon.log()).len(), 1);

    // A reload gives the plugin another try (its budget counts again from zero, and the warm-up and the
    // first chunks run on it).
    let reloaded = proxy.reload().await.unwrap();
    assert!(reloaded.contains("model"), "{reloaded}");
    assert_eq!(backends(&proxy).await["decoder"], "faulty");
    let third = spiel(&connection, text).await;
    assert_eq!(third, first);
    daemon.check_running();
}
