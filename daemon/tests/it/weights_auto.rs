//! `[model] weights = "auto"` through the daemon, on real services (a private `dbus-daemon`, `kazeiad` serving the
//! tiny fixture model to a null sink): the `Weights` property — what `kazeia status` prints — names the format
//! the daemon measured its way to and why; the log says the same; a restart decides from the kept measurement
//! without timing again (once it has settled: see `SETTLING_TIMINGS`); a named format is reported as
//! configured, with no measurement.

use std::path::Path;
use std::time::{Duration, Instant};

use kazeia_engine::weights_auto::SETTLING_TIMINGS;
use kazeia_tests::services::{DbusSession, Service, TempDir};
use kazeiad::dbus::client::SpeechProxy;

use crate::common::{connect, proxy, quick_model, start_daemon, write_config};

/// `Weights` once the model is loaded.
async fn loaded_weights(proxy: &SpeechProxy<'_>, daemon: &mut Service) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    while proxy.state().await.map_or(true, |s| s == "loading") {
        daemon.check_running();
        assert!(Instant::now() < deadline, "the model never loaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.weights().await.unwrap()
}

fn measurements(cache: &Path) -> Vec<String> {
    std::fs::read_dir(cache)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n.starts_with("auto-") && n.ends_with(".json"))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_weights_are_reported_with_their_reason_and_measured_once() {
    let dir = TempDir::new("weights-auto");
    let config = dir.path().join("kazeia.toml");
    write_config(&config, &quick_model(), "null", "");
    let cache = dir.path().join("cache");
    let bus = DbusSession::start(None);
    let mut env = bus.env();
    env.push(("KAZEIA_CACHE_DIR".into(), cache.display().to_string()));
    let connection = connect(&bus).await;
    let proxy = proxy(&connection).await;

    let mut daemon = start_daemon(&bus, &env, &config, dir.path().join("first.log"));
    let weights = loaded_weights(&proxy, &mut daemon).await;
    let format = weights.split(' ').next().unwrap().to_owned();
    assert!(
        ["bf16", "q8_0", "q4_0"].contains(&format.as_str()),
        "{weights}"
    );
    for part in [
        "(auto: ",
        "predicted RTF bf16 ",
        ", q8_0 ",
        ", q4_0 ",
        "measured q4_0",
        "timed now",
    ] {
        assert!(weights.contains(part), "no `{part}` in {weights}");
    }
    assert_eq!(measurements(&cache).len(), 1, "one measurement kept");
    let log = daemon.log();
    assert!(
        log.contains(&format!("weights {format} (auto: ")),
        "the choice is not in the log:\n{log}"
    );
    daemon.terminate();

    // Restarts on the same machine: while the kept measurement does not pick bf16 (a debug build, a busy
    // machine) it is timed again and combined, up to SETTLING_TIMINGS steps; then it decides: nothing timed.
    let (mut format, mut steps) = (format, 1);
    let mut daemon = loop {
        let log = dir.path().join(format!("restart-{steps}.log"));
        let mut daemon = start_daemon(&bus, &env, &config, log);
        let again = loaded_weights(&proxy, &mut daemon).await;
        assert_eq!(measurements(&cache).len(), 1);
        if again.contains("cached") {
            assert!(again.starts_with(&format!("{format} (auto: ")), "{again}");
            assert!(!again.contains("timed now"), "{again}");
            break daemon;
        }
        steps += 1;
        assert!(
            format != "bf16" && steps <= SETTLING_TIMINGS,
            "timed again after {} step(s) that chose {format}: {again}",
            steps - 1
        );
        assert!(
            again.contains(&format!("the best of {steps} steps, the last timed now")),
            "{again}"
        );
        format = again.split(' ').next().unwrap().to_owned();
        daemon.terminate();
    };

    // A named format is obeyed and said to be configured (the file change reloads the model).
    std::fs::write(
        &config,
        format!(
            "[model]\npath = \"{}\"\nweights = \"q8_0\"\n[audio]\nsink = \"null\"\n[threads]\ntalker = 1\n\
             code_predictor = 1\ndecoder = 1\n",
            quick_model().display()
        ),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let weights = proxy.weights().await.unwrap();
        if weights == "q8_0 (as configured)" {
            break;
        }
        daemon.check_running();
        assert!(
            Instant::now() < deadline,
            "the named format was not applied: {weights}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(measurements(&cache).len(), 1);
}
