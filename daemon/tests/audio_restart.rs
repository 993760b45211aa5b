//! The daemon's speech across a restart of the audio server: a real `kazeiad` playing to a headless PipeWire
//! (null sink, recorded by `pw-record`) that is killed mid-utterance and started again.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{connect, priority, proxy, spiel, start_daemon, write_config, Finishes};
use kazeia_tests::services::{DbusSession, PipeWire, Recorder, TempDir};
use kazeia_tests::speaking_model;

/// Louder than this is speech.
const THRESHOLD: f32 = 0.01;

/// Seconds of 5 ms windows holding a sample louder than [`THRESHOLD`] (silent gaps left out).
fn loud_seconds(samples: &[f32], rate: u32) -> f64 {
    let window = rate as usize / 200;
    let loud = samples
        .chunks(window)
        .filter(|w| w.iter().any(|s| s.abs() > THRESHOLD))
        .count();
    (loud * window) as f64 / rate as f64
}

/// Sends `signal` (`STOP`, `CONT`) to process `pid`.
fn signal(pid: u32, signal: &str) {
    let sent = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("kill");
    assert!(sent.success(), "kill -{signal} {pid}");
}

/// PipeWire dies while the daemon speaks a long text, and starts again: the text is spoken on from where
/// it was cut and finishes `done`, and a text spoken during the gap waits for the server and is heard too.
/// What both recorders heard together is what the two texts sound like whole (from Spiel, greedy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipewire_restart_mid_utterance_loses_nothing() {
    let dir = TempDir::new("daemon-pw-restart");
    let model = speaking_model(dir.path());
    let config = dir.path().join("kazeia.toml");
    // Greedy: the same audio every time (about 1.1 s per chunk of 400 characters).
    write_config(&config, &model, "pipewire", "[generation]\ngreedy = true\n");
    let bus = DbusSession::start(None);
    let mut pw = PipeWire::start(&bus);
    let daemon = start_daemon(&bus, &pw.env(), &config, dir.path().join("kazeiad.log"));
    let connection = connect(&bus).await;
    let api = proxy(&connection).await;
    let long = "Hello world, this is a test. ".repeat(100);
    let short = "Said while the audio server was away.";
    let whole_long = spiel(&connection, &long).await.unwrap();
    let whole_short = spiel(&connection, short).await.unwrap();
    let (loud_long, loud_short) = (
        loud_seconds(&whole_long, 24_000),
        loud_seconds(&whole_short, 24_000),
    );
    let whole = loud_long + loud_short;

    let mut finishes = Finishes::new(&api).await;
    let before = Recorder::start(&pw);
    let asked = Instant::now();
    // Messages: the second does not cancel the first (as a second text would).
    let id = api.speak(&long, priority("message")).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while before.sound_since(asked, THRESHOLD).is_none() {
        assert!(Instant::now() < deadline, "no speech:\n{}", daemon.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Heard for a while, then the server dies.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    pw.kill_server();
    let before = before.stop();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let queued = api.speak(short, priority("message")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The daemon is held while the new server and its recorder start, so that the recorder hears all
    // that follows (left running, it would take up the speech as soon as the server's socket is there).
    signal(daemon.pid(), "STOP");
    drop(pw);
    let pw = PipeWire::start(&bus);
    let after = Recorder::start(&pw);
    let resumed = Instant::now();
    signal(daemon.pid(), "CONT");
    let gap = Instant::now() - resumed;
    assert_eq!(
        finishes.of(id, Duration::from_secs(60)).await,
        "done",
        "{}",
        daemon.log()
    );
    assert_eq!(finishes.of(queued, Duration::from_secs(30)).await, "done");
    let back = after.sound_since(resumed, THRESHOLD);
    let after = after.stop();

    let heard_before = loud_seconds(&before.samples, before.rate);
    let heard_after = loud_seconds(&after.samples, after.rate);
    let back_ms = back.map(|b| (b - resumed).as_secs_f64() * 1e3);
    eprintln!(
        "restart: heard {heard_before:.3} s before the server died and {heard_after:.3} s after, of \
         {whole:.3} s of speech in both texts (the first {:.3} s long, {loud_long:.3} s loud); speech came \
         back {back_ms:.1?} ms after the daemon could see the new server (continued {:.1} ms after it)",
        whole_long.len() as f64 / 24_000.0,
        gap.as_secs_f64() * 1e3
    );
    // Cut in the middle: much of the long text is left for after the restart.
    assert!(
        heard_before > 1.0,
        "heard {heard_before} s before the restart"
    );
    assert!(
        heard_after > loud_short + 1.0,
        "the long text was over before the restart: {heard_after} s heard after it, the short one is \
         {loud_short} s"
    );
    // Nothing lost, and only what the server held unplayed (a few ms) heard twice; loud 5 ms windows
    // counted in three recordings may each differ by a window or two.
    assert!(
        (heard_before + heard_after - whole).abs() < 0.1,
        "heard {heard_before} + {heard_after} s of {whole} s"
    );
    assert!(back_ms.is_some_and(|ms| ms < 1000.0), "{back_ms:?}");
    let log = daemon.log();
    assert!(
        log.contains("waits up to 30 s for the audio server"),
        "{log}"
    );
    assert!(log.contains("the utterance goes on"), "{log}");
}
