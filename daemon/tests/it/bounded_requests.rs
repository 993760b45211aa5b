//! What one request may cost the daemon, on the real services: a private `dbus-daemon`, a headless
//! PipeWire with a null sink, and `kazeiad` serving the tiny fixture model.
//!
//! - A `Speak` of 20,000 `<break time="10s"/>` (under 1 MiB, 55 hours of silence asked for) keeps the
//!   daemon's memory bounded: silence is produced as playback takes it, and capped per utterance.
//! - A parse runs off the D-Bus executor: `Stop` is answered while a huge one is in progress.
//! - `<prosody volume="silent">` around a huge gain is silent.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use kazeia_tests::services::DbusSession;
use kazeiad::config::DaemonConfig;
use kazeiad::dbus::client::SpeechProxy;
use kazeiad::player::Player;
use kazeiad::request::{Client, Output};
use kazeiad::service::{Refusal, Service, SpeakOptions};
use zbus::wire::Variant;

use crate::common::{memory_kib, spiel_proxy, TestDaemon};

async fn proxy(bus: &DbusSession) -> (zbus::Connection, SpeechProxy<'static>) {
    let connection = zbus::connection::Builder::address(bus.address())
        .build()
        .await
        .expect("cannot connect to the test bus");
    let proxy = SpeechProxy::builder(&connection).build().await.unwrap();
    (connection, proxy)
}

fn ssml() -> HashMap<&'static str, Variant<'static>> {
    HashMap::from([("ssml", Variant::from(true))])
}

/// Resident memory of a process, in bytes.
fn rss(pid: u32) -> u64 {
    memory_kib(pid, "VmRSS") * 1024
}

/// Asserts that a call was refused as invalid, the error naming `field`, and short.
fn refused_as_invalid<T: std::fmt::Debug>(reply: zbus::Result<T>, field: &str) {
    let e = reply.expect_err(field).to_string();
    assert!(
        e.contains("InvalidArgs") && e.contains(field) && e.len() < 400,
        "{field}: {e}"
    );
}

/// Waits for `Finished(id, _)`; the reason.
async fn finished(
    stream: &mut kazeiad::dbus::client::FinishedStream,
    id: u64,
    timeout: Duration,
) -> String {
    tokio::time::timeout(timeout, async {
        loop {
            let signal = stream.next().await.expect("the signal stream ended");
            let args = signal.args().unwrap();
            if args.id == id {
                return args.reason.clone();
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no Finished for {id} within {timeout:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_bomb_keeps_memory_bounded_and_stop_everyone_still_works() {
    let mut daemon =
        TestDaemon::setup("bounded-breaks", "[generation]\nmax_frames = 8\n").pipewire();
    let (_connection, proxy) = proxy(&daemon.bus).await;
    let mut done = proxy.receive_finished().await.unwrap();
    let mut started = proxy.receive_started().await.unwrap();

    // Warm: one utterance played, so what the first playback allocates is in the baseline.
    let warm = proxy.speak("Hello.", HashMap::new()).await.unwrap();
    assert_eq!(
        finished(&mut done, warm, Duration::from_secs(60)).await,
        "done"
    );
    let before = rss(daemon.service.pid());

    // Marks keep the breaks apart (adjacent ones merge into one of at most 10 s).
    let bomb = format!(
        "<speak>{}</speak>",
        "<break time=\"10s\"/><mark name=\"m\"/>".repeat(20_000)
    );
    assert!(bomb.len() < 1 << 20);
    let id = proxy.speak(&bomb, ssml()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), started.next())
        .await
        .expect("Started")
        .unwrap();
    // It used to grow by gigabytes within seconds; now it holds ~1.5 s of audio ahead.
    let mut peak = before;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        peak = peak.max(rss(daemon.service.pid()));
        assert!(
            peak < before + (64 << 20),
            "the daemon grew from {} MB to {} MB",
            before >> 20,
            peak >> 20
        );
    }
    daemon.service.check_running();
    eprintln!(
        "RSS {:.1} MB before the break bomb, at most {:.1} MB in 3 s of it",
        before as f64 / 1e6,
        peak as f64 / 1e6
    );

    // Still playing its pauses (a minute of them), and a stop ends it at once.
    let stop_at = Instant::now();
    assert_eq!(proxy.stop_everyone().await.unwrap(), 1);
    assert_eq!(
        finished(&mut done, id, Duration::from_secs(5)).await,
        "stopped"
    );
    eprintln!(
        "Finished(stopped) {:.1} ms after StopEveryone",
        stop_at.elapsed().as_secs_f64() * 1e3
    );
    // And the daemon serves the next client as before.
    let next = proxy.speak("Hello again.", HashMap::new()).await.unwrap();
    assert_eq!(
        finished(&mut done, next, Duration::from_secs(60)).await,
        "done"
    );
}

/// Without `spawn_blocking`, the parse would hold the only executor thread here and the other task
/// could not run until it ended; the daemon's executor has two threads, and two clients would do.
#[tokio::test(flavor = "current_thread")]
async fn stop_is_answered_while_a_huge_parse_runs() {
    let mut config = DaemonConfig::default();
    config.queue.max_text_bytes = 64 << 20;
    let player = Arc::new(Player::new(config, |_| {}));
    let service = Service::new(player.clone(), None);
    // 8 MiB of sentence tags and words, malformed at the very end: the whole of it is parsed.
    let huge = "<s/>word ".repeat((8 << 20) / 9) + "<unclosed";
    let submitted = Arc::new(AtomicBool::new(false));
    let answered_during_parse = Arc::new(AtomicBool::new(false));
    let stopper = tokio::spawn({
        let (player, submitted, answered) = (
            player.clone(),
            submitted.clone(),
            answered_during_parse.clone(),
        );
        async move {
            tokio::task::yield_now().await;
            // What StopEveryone does, from another client's task.
            player.queue.stop_where(|_| true);
            answered.store(!submitted.load(Ordering::SeqCst), Ordering::SeqCst);
        }
    });
    let options = SpeakOptions {
        ssml: true,
        ..SpeakOptions::default()
    };
    let t = Instant::now();
    let refused = service
        .submit(&Client::alone("client"), &huge, options, Output::Sink)
        .await;
    submitted.store(true, Ordering::SeqCst);
    let parse_time = t.elapsed();
    stopper.await.unwrap();
    assert!(
        matches!(refused, Err(Refusal::InvalidSsml(ref e)) if e.contains("unterminated tag")),
        "{refused:?}"
    );
    eprintln!(
        "an 8 MiB parse took {:.0} ms",
        parse_time.as_secs_f64() * 1e3
    );
    assert!(
        answered_during_parse.load(Ordering::SeqCst),
        "the stop waited for the parse to end"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silence_around_a_huge_gain_is_silent() {
    let setup = TestDaemon::setup(
        "bounded-silent",
        "[generation]\ngreedy = true\nmax_frames = 8\n",
    );
    let wav = setup.dir().join("out.wav");
    let daemon = setup.wav(&wav);
    let (_connection, proxy) = proxy(&daemon.bus).await;
    let mut done = proxy.receive_finished().await.unwrap();
    let samples = || {
        let bytes = std::fs::read(&wav).unwrap();
        kazeiad::audio::wav_read::parse_wav(&bytes).unwrap().samples
    };

    let silent = "<speak><prosody volume=\"silent\"><prosody volume=\"+99999dB\">Hello world.\
                  </prosody></prosody></speak>";
    let id = proxy.speak(silent, ssml()).await.unwrap();
    assert_eq!(
        finished(&mut done, id, Duration::from_secs(60)).await,
        "done"
    );
    let heard = samples();
    assert!(!heard.is_empty(), "nothing was synthesised");
    assert!(heard.iter().all(|&s| s == 0.0), "a silent text was heard");

    // The same words at the voice's volume are heard: the check above can fail.
    let id = proxy.speak("Hello world.", HashMap::new()).await.unwrap();
    assert_eq!(
        finished(&mut done, id, Duration::from_secs(60)).await,
        "done"
    );
    assert!(samples()[heard.len()..].iter().any(|&s| s != 0.0));
}

/// Every string of a request has a length limit with a clear error (issue 40, item 4): a 2 MB `instruct`
/// would otherwise go whole into the talker's prompt (prefill, keys and values grow with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_string_is_bounded_with_a_clear_error() {
    // A 1.7B CustomVoice model: it takes instructions.
    let mut daemon = TestDaemon::setup("bounded-strings", "[generation]\nmax_frames = 6\n")
        .model(kazeia_tests::fixtures_dir().join("lm/shape_1b7"))
        .null();
    let (connection, proxy) = proxy(&daemon.bus).await;
    let mut done = proxy.receive_finished().await.unwrap();
    let string = |key: &'static str, value: String| HashMap::from([(key, Variant::from(value))]);
    let huge = |n: usize| "calm ".repeat(n / 5);

    // Each field over its bound is refused as invalid, the error naming it, and short.
    for (options, field) in [
        (string("instruct", huge(2 << 20)), "instruct"),
        (string("instruct", "x".repeat(1025)), "instruct"),
        (string("voice", huge(1 << 20)), "voice"),
        (string("language", huge(1 << 20)), "language"),
        (string("priority", huge(1 << 20)), "priority"),
    ] {
        refused_as_invalid(proxy.speak("Hi.", options).await, field);
    }
    let mut odd_key = HashMap::new();
    let key = "k".repeat(100_000);
    odd_key.insert(key.as_str(), Variant::from(1.0f64));
    let e = proxy.speak("Hi.", odd_key).await.unwrap_err().to_string();
    assert!(
        e.contains("unknown option") && e.len() < 400,
        "{}",
        &e[..e.len().min(400)]
    );

    // Spiel's voice and language too.
    let spiel = spiel_proxy(&connection).await;
    for (voice, language, field) in [
        (huge(1 << 20), String::new(), "voice"),
        (String::new(), huge(1 << 20), "language"),
    ] {
        let (_reader, writer) = std::io::pipe().unwrap();
        let fd: std::os::fd::OwnedFd = writer.into();
        let synthesize = (
            zbus::Fd::from(&fd),
            "Hi.",
            voice.as_str(),
            1.0f64,
            1.0f64,
            false,
            language.as_str(),
        );
        let sent = spiel.call::<_, _, ()>("Synthesize", &synthesize).await;
        refused_as_invalid(sent, field);
    }

    // An instruction within the bound is spoken, and so is the next client's text.
    let id = proxy
        .speak("Hi.", string("instruct", "x".repeat(1024)))
        .await
        .unwrap();
    assert_eq!(
        finished(&mut done, id, Duration::from_secs(60)).await,
        "done"
    );
    let id = proxy.speak("Hello again.", HashMap::new()).await.unwrap();
    assert_eq!(
        finished(&mut done, id, Duration::from_secs(60)).await,
        "done"
    );
    daemon.service.check_running();
}
