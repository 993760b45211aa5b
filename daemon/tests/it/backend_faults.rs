//! A backend that fails while the daemon speaks, on real services: a private `dbus-daemon`, `kazeiad` with its
//! decoder on the real `faulty` test plugin (`tests/faulty-plugin`, dlopen'ed; its op lists fail after
//! `KAZEIA_FAULTY_AFTER`), and Spiel clients reading the stream. The utterance is spoken whole, the stage moves
//! to the CPU with one warning, later utterances are the same audio, and a reload tries the plugin again.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::StreamExt;

use kazeiad::dbus::client::SpeechProxy;

use crate::common::{client_in_this_process, spiel, TestDaemon};

async fn backends(proxy: &SpeechProxy<'_>) -> HashMap<String, String> {
    proxy.backends().await.unwrap()
}

fn warnings(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("runs on the CPU until the next reload"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decoder_plugin_that_fails_mid_utterance_falls_back_and_the_utterance_is_spoken_whole() {
    let plugin = kazeia_tests::faulty_plugin();
    // A named weight format: `auto` would time a few frames at load, on the faulty decoder too, and so spend
    // some of the lists the fault is counted in (the test counts from the warm-up).
    let setup = TestDaemon::setup(
        "daemon-faults",
        &format!(
            "[generation]\ngreedy = true\n[stream]\nfirst_chunk_frames = 1\nchunk_frames = 2\n\
             [backends]\ndecoder = \"faulty\"\nplugin_path = [\"{}\"]\n",
            plugin.parent().unwrap().display()
        ),
    );
    let cache = setup.dir().join("cache").display().to_string();
    // The warm-up runs at most 4 decoder lists (3 frames: the first chunk's three, the stages before the
    // vocoder and its two parts, then one); the first utterance's lists fail from its third on (its first
    // chunk's second part, or a later chunk), after audio went out.
    let mut daemon = setup
        .speaking()
        .weights("bf16")
        .env("KAZEIA_FAULTY_AFTER", "6")
        .env("KAZEIA_CACHE_DIR", &cache)
        .null();
    // Uncached: each read asks the daemon.
    let (connection, proxy) = client_in_this_process(&daemon.bus).await;
    assert_eq!(backends(&proxy).await["decoder"], "faulty");
    assert!(
        warnings(&daemon.service.log()).is_empty(),
        "{}",
        daemon.service.log()
    );

    // A client that caches properties learns of the fallback from PropertiesChanged.
    let watching = SpeechProxy::new(&connection).await.unwrap();
    let mut backends_changed = watching.receive_backends_changed().await;

    let text = "Hello world, this is a test of a failing device.";
    let first = spiel(&connection, text).await.expect("Synthesize");
    daemon.service.check_running();
    let seconds = first.len() as f64 / 24000.0;
    assert!(seconds > 1.0, "only {seconds} s");
    let logged = daemon.service.log();
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
    let second = spiel(&connection, text).await.expect("Synthesize");
    assert_eq!(second.len(), first.len());
    assert_eq!(second, first);
    assert_eq!(warnings(&daemon.service.log()).len(), 1);

    // A reload gives the plugin another try (its budget counts again from zero, and the warm-up and the
    // first chunks run on it).
    let reloaded = proxy.reload().await.unwrap();
    assert!(reloaded.contains("model"), "{reloaded}");
    assert_eq!(backends(&proxy).await["decoder"], "faulty");
    let third = spiel(&connection, text).await.expect("Synthesize");
    assert_eq!(third, first);
    daemon.service.check_running();
}
