//! A misbehaving client affects only itself (issue 15, "Clients"), speech-dispatcher's priority model on
//! the bus (issue 18), faults that end one utterance only, and a soak of many clients at once: `kazeiad`
//! on a private `dbus-daemon`, with the tiny fixture models.

use crate::common::*;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

/// A Spiel stream that fills a pipe (64 KiB) at once: three seconds of silence between two words.
const FILLS_A_PIPE: &str = "<speak>Stalled.<break time=\"3s\"/>Still stalled.</speak>";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spiel_client_that_stops_reading_holds_up_nobody() {
    let mut daemon = TestDaemon::null(
        "clients-stall",
        "[generation]\nmax_frames = 6\n[queue]\nstall_timeout_ms = 1500\n",
    );
    let stalled_client = connect(&daemon.bus).await;
    let (other, other_api) = client(&daemon.bus).await;
    let mut finishes = Finishes::new(&other_api).await;

    // A client keeps its pipe open and never reads.
    let stalled = synthesize(&stalled_client, FILLS_A_PIPE, true)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Everyone else is heard meanwhile: the speakers and another Spiel client.
    let asked = Instant::now();
    assert_eq!(
        finishes
            .message(&other_api, "Heard by everyone.", Duration::from_secs(20))
            .await,
        "done"
    );
    let samples = spiel(&other, "Also heard.").await.unwrap();
    assert!(!samples.is_empty());
    eprintln!(
        "with a stalled Spiel reader: Speak done and a Spiel stream read in {:.2} s",
        asked.elapsed().as_secs_f64()
    );
    // The stalled client is dropped after its deadline, its utterance cancelled and its pipe closed.
    finishes
        .any_with("cancelled", Duration::from_secs(10))
        .await;
    let rest = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut stalled = stalled;
        let mut all = Vec::new();
        stalled.read_to_end(&mut all).map(|_| all.len())
    });
    let read = tokio::time::timeout(Duration::from_secs(5), rest)
        .await
        .expect("the daemon closed the stalled pipe")
        .unwrap()
        .unwrap();
    assert!(read > 32 << 10, "it had filled the pipe: {read} bytes");

    // A stop cuts a write that waits for room short.
    let _stalled = synthesize(&stalled_client, FILLS_A_PIPE, true)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stop_at = Instant::now();
    assert_eq!(other_api.stop_everyone().await.unwrap(), 1);
    finishes.any_with("stopped", Duration::from_secs(2)).await;
    eprintln!(
        "a stop ended the stalled stream in {:.1} ms",
        stop_at.elapsed().as_secs_f64() * 1e3
    );
    daemon.service.check_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spiel_streams_of_different_clients_are_served_at_once() {
    let daemon = TestDaemon::setup(
        "clients-concurrent",
        "[generation]\ngreedy = true\nmax_frames = 25\n",
    )
    .speaking()
    .null();
    let app = connect(&daemon.bus).await;
    let screen_reader = connect(&daemon.bus).await;

    // An app streams a long text, read as its player plays it (here at twice real time).
    let long = "This is a long article read aloud, sentence after sentence. ".repeat(48);
    let reader = synthesize(&app, &long, false).await.unwrap();
    let app_stream = tokio::task::spawn_blocking(move || {
        let samples = read_stream(reader, Some(2.0 * 48000.0));
        (samples.len(), Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // The screen reader's next message does not wait behind it.
    let asked = Instant::now();
    let message = spiel(&screen_reader, "Screen reader on.").await.unwrap();
    let message_done = Instant::now();
    let (app_samples, app_done) = app_stream.await.unwrap();
    eprintln!(
        "message streamed in {:.2} s while the app's {:.1} s stream went on for {:.2} s more",
        (message_done - asked).as_secs_f64(),
        app_samples as f64 / 24000.0,
        app_done
            .saturating_duration_since(message_done)
            .as_secs_f64()
    );
    assert!(!message.is_empty());
    // Served one after the other, the message would come once the app's stream is written, less than a
    // pipe's worth (0.7 s at this pace) before its reader is done.
    assert!(
        app_done.saturating_duration_since(message_done) > Duration::from_secs(2),
        "the message waited for the app's stream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_cannot_fill_the_queue_for_everyone() {
    let daemon = TestDaemon::null("clients-flood", "[generation]\nmax_frames = 6\n");
    let (flood, flood_api) = client(&daemon.bus).await;
    let (_other, other_api) = client(&daemon.bus).await;
    let mut finishes = Finishes::new(&other_api).await;

    // One client holds its own speech and sends 400 messages.
    flood_api.pause().await.unwrap();
    let (mut accepted, mut refused) = (Vec::new(), 0);
    for n in 0..400 {
        match flood_api
            .speak(&format!("Flood {n}."), priority("message"))
            .await
        {
            Ok(id) => accepted.push(id),
            Err(e) => {
                assert!(e.to_string().contains("QueueFull"), "{e}");
                refused += 1;
            }
        }
    }
    eprintln!(
        "400 messages from one client: {} accepted, {refused} refused",
        accepted.len()
    );
    assert_eq!(accepted.len(), 64, "[queue] max_per_client");
    // Another client's message and text are accepted and heard.
    for p in ["message", "text"] {
        let id = other_api
            .speak(&format!("Another client's {p}."), priority(p))
            .await
            .expect("accepted");
        assert_eq!(finishes.of(id, Duration::from_secs(20)).await, "done");
    }
    // The flooding client leaves: its pause ends and what it held is cancelled, each once.
    drop(flood_api);
    drop(flood);
    for id in accepted {
        assert_eq!(finishes.of(id, Duration::from_secs(10)).await, "cancelled");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_belongs_to_the_client_that_paused_and_ends_when_it_leaves() {
    // Played in real time: 3.2 s per sentence chunk.
    let daemon = TestDaemon::pipewire("clients-pause", "[generation]\nmax_frames = 40\n");
    let (_pauser, pauser_api) = client(&daemon.bus).await;
    let (_other, other_api) = client(&daemon.bus).await;
    let mut finishes = Finishes::new(&other_api).await;
    let mut started = other_api.receive_started().await.unwrap();
    let long = "A long text that its client pauses. ".repeat(30);

    let held = pauser_api.speak(&long, priority("message")).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(30), started.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.args().unwrap().id, held);
    pauser_api.pause().await.unwrap();
    assert_eq!(other_api.state().await.unwrap(), "paused");
    // Another client is heard while the first one is paused.
    assert_eq!(
        finishes
            .message(
                &other_api,
                "Not held by someone else's pause.",
                Duration::from_secs(30)
            )
            .await,
        "done"
    );
    // The paused one resumes when its client says so, and finishes.
    pauser_api.resume().await.unwrap();
    assert_eq!(finishes.of(held, Duration::from_secs(120)).await, "done");

    // A client that pauses and leaves: its pause ends with it, and what it held is cancelled.
    let (leaver, leaver_api) = client(&daemon.bus).await;
    let left = leaver_api.speak(&long, priority("message")).await.unwrap();
    leaver_api.pause().await.unwrap();
    drop(leaver_api);
    drop(leaver);
    assert_eq!(
        finishes.of(left, Duration::from_secs(10)).await,
        "cancelled"
    );
    assert_eq!(
        finishes
            .message(&other_api, "Heard after it left.", Duration::from_secs(30))
            .await,
        "done"
    );
    assert_eq!(other_api.state().await.unwrap(), "idle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speech_dispatchers_priority_rules_on_the_bus() {
    let daemon = TestDaemon::null("clients-priorities", "[generation]\nmax_frames = 6\n");
    let (_connection, api) = client(&daemon.bus).await;
    let mut finishes = Finishes::new(&api).await;
    let mut started = api.receive_started().await.unwrap();
    // Held by the client's own pause, so that the rules act on waiting utterances.
    api.pause().await.unwrap();
    let mut ids = HashMap::new();
    for (name, p) in [
        ("t1", "text"),
        ("t2", "text"),         // a text cancels the other texts
        ("m1", "message"),      // a message cancels texts
        ("n1", "notification"), // dropped: a message waits
        ("p1", "progress"),     // dropped, held back as the last of its series…
        ("p2", "progress"),     // …until this newer one replaces it
        ("i1", "important"),
    ] {
        let id = api
            .speak(&format!("Say {name}."), priority(p))
            .await
            .unwrap();
        ids.insert(name, id);
    }
    for name in ["t1", "t2", "n1", "p1"] {
        assert_eq!(
            finishes.of(ids[name], Duration::from_secs(10)).await,
            "cancelled",
            "{name}"
        );
    }
    api.resume().await.unwrap();
    let mut order = Vec::new();
    for _ in 0..3 {
        let s = tokio::time::timeout(Duration::from_secs(20), started.next())
            .await
            .unwrap()
            .unwrap();
        let id = s.args().unwrap().id;
        order.push(*ids.iter().find(|(_, v)| **v == id).unwrap().0);
    }
    // The important first, then the message, then the last progress, said as a message.
    assert_eq!(order, ["i1", "m1", "p2"]);
    for name in ["i1", "m1", "p2"] {
        assert_eq!(
            finishes.of(ids[name], Duration::from_secs(20)).await,
            "done"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panics_end_that_utterance_and_the_daemon_keeps_speaking() {
    let mut daemon = TestDaemon::setup("clients-panic", "[generation]\nmax_frames = 6\n")
        .env("KAZEIA_TEST_FAULTS", "1")
        .null();
    let (connection, api) = client(&daemon.bus).await;
    let mut finishes = Finishes::new(&api).await;
    for (fault, expected) in [
        ("kazeia-panic-worker", "internal error"),
        ("kazeia-panic-decoder", "panicked"),
    ] {
        let id = api
            .speak(&format!("Here {fault} now."), priority("message"))
            .await
            .unwrap();
        let reason = finishes.of(id, Duration::from_secs(20)).await;
        assert!(
            reason.starts_with("error: ") && reason.contains(expected),
            "{fault}: {reason}"
        );
        assert_eq!(
            finishes
                .message(&api, "Still speaking.", Duration::from_secs(20))
                .await,
            "done"
        );
        // On a Spiel stream too: that stream ends, the next one is heard.
        let samples = spiel(&connection, &format!("Streamed {fault}."))
            .await
            .unwrap();
        assert!(
            samples.is_empty(),
            "{fault}: the stream ended without audio"
        );
        assert!(!spiel(&connection, "Streamed after it.")
            .await
            .unwrap()
            .is_empty());
    }
    daemon.service.check_running();
    let log = daemon.service.log();
    assert!(log.contains("injected fault"), "{log}");
}

/// A client of the soak test.
#[derive(Clone, Copy, Debug)]
enum Behaviour {
    /// Speaks and waits: everything it says is heard.
    Behaves,
    /// Stops some of its utterances, some with StopAll.
    Stops,
    /// Pauses, speaks, resumes: heard.
    Pauses,
    /// Speaks (sometimes paused) and leaves the bus at once.
    Leaves,
    /// Spiel requests whose pipes it never reads.
    Stalls,
    /// Spiel requests read to the end: heard.
    Streams,
}

const BEHAVIOURS: [Behaviour; 6] = [
    Behaviour::Behaves,
    Behaviour::Stops,
    Behaviour::Pauses,
    Behaviour::Leaves,
    Behaviour::Stalls,
    Behaviour::Streams,
];

/// A small deterministic generator (xorshift64*), for the soak's random choices.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) % n
    }
}

/// What one soak client saw: ids it had accepted (for the speakers) and Spiel requests accepted.
struct ClientReport {
    accepted: Vec<u64>,
    streams: usize,
}

async fn soak_client(
    address: String,
    behaviour: Behaviour,
    utterances: usize,
    seed: u64,
) -> ClientReport {
    let mut rng = Rng(seed | 1);
    // A process of its own: the daemon counts limits and streams per process.
    let connection = connect_as_new_process(&address).await;
    let api = proxy(&connection).await;
    let finishes = Collector::start(&api).await;
    let mut report = ClientReport {
        accepted: Vec::new(),
        streams: 0,
    };
    let speak_all = |api: &kazeiad::dbus::client::SpeechProxy<'static>, p: &'static str| {
        let api = api.clone();
        async move {
            let mut ids = Vec::new();
            for u in 0..utterances {
                let id = api
                    .speak(&format!("Utterance {u} of {p}."), priority(p))
                    .await
                    .expect("a soak client stays within its limits");
                ids.push(id);
            }
            ids
        }
    };
    match behaviour {
        Behaviour::Behaves | Behaviour::Pauses => {
            let paused = matches!(behaviour, Behaviour::Pauses);
            if paused {
                api.pause().await.unwrap();
            }
            report.accepted = speak_all(&api, "message").await;
            if paused {
                tokio::time::sleep(Duration::from_millis(rng.below(300))).await;
                api.resume().await.unwrap();
            }
            for &id in &report.accepted {
                let reason = finishes.of(id, Duration::from_secs(120)).await;
                assert_eq!(reason, "done", "{behaviour:?} client, utterance {id}");
            }
        }
        Behaviour::Stops => {
            report.accepted =
                speak_all(&api, if rng.below(2) == 0 { "message" } else { "text" }).await;
            for _ in 0..3 {
                let id = report.accepted[rng.below(utterances as u64) as usize];
                let _ = api.stop(id).await; // UnknownId once it has finished
                tokio::time::sleep(Duration::from_millis(rng.below(50))).await;
            }
            if rng.below(2) == 0 {
                api.stop_all().await.unwrap();
            }
            for &id in &report.accepted {
                let reason = finishes.of(id, Duration::from_secs(120)).await;
                assert!(
                    ["done", "stopped", "cancelled"].contains(&reason.as_str()),
                    "{reason}"
                );
            }
        }
        Behaviour::Leaves => {
            if rng.below(2) == 0 {
                api.pause().await.unwrap();
            }
            report.accepted = speak_all(&api, "message").await;
        }
        Behaviour::Stalls => {
            let mut pipes = Vec::new();
            for _ in 0..utterances.min(2) {
                pipes.push(synthesize(&connection, FILLS_A_PIPE, true).await.unwrap());
                report.streams += 1;
            }
            // Held open, unread, until the daemon gives up on them.
            tokio::time::sleep(Duration::from_millis(2500)).await;
            drop(pipes);
        }
        Behaviour::Streams => {
            for u in 0..utterances {
                let samples = spiel(&connection, &format!("Streamed utterance {u}."))
                    .await
                    .unwrap();
                assert!(!samples.is_empty(), "a Spiel client that reads is heard");
                report.streams += 1;
            }
        }
    }
    report
}

/// What the daemon holds now: resident memory (MiB), threads, open file descriptors.
fn holdings(pid: u32) -> (f64, usize, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    (field("VmRSS:") / 1024.0, field("Threads:") as usize, fds)
}

/// Rounds of `clients` clients at once, `utterances` each, for at least two rounds and at least `duration`:
/// none lost (exactly one `Finished` per accepted utterance), every client that behaves heard, the daemon's
/// peak RSS bounded, and what it holds once quiet — resident memory, threads, open descriptors — no more
/// after the last round than after the first (a leak per request or per client grows with the rounds).
async fn soak(clients: usize, utterances: usize, seed: u64, duration: Duration) {
    let started = Instant::now();
    let mut daemon = TestDaemon::null(
        "clients-soak",
        "[generation]\nmax_frames = 6\n[queue]\nstall_timeout_ms = 1000\nmax_utterances = 1024\n",
    );
    let before = peak_rss_mib(daemon.service.pid());
    // Every Finished, seen by a client that stays to the end.
    let (_monitor, monitor_api) = client(&daemon.bus).await;
    let all = Collector::start(&monitor_api).await;

    let mut rng = Rng(seed);
    let (mut accepted, mut streams) = (Vec::new(), 0);
    let mut held = Vec::new();
    while held.len() < 2 || started.elapsed() < duration {
        let tasks: Vec<_> = (0..clients)
            .map(|c| {
                let behaviour = BEHAVIOURS[c % BEHAVIOURS.len()];
                tokio::spawn(soak_client(
                    daemon.bus.address().to_owned(),
                    behaviour,
                    utterances,
                    rng.below(u64::MAX),
                ))
            })
            .collect();
        for task in tasks {
            let report = task.await.expect("a soak client failed");
            accepted.extend(report.accepted);
            streams += report.streams;
        }
        // Exactly one Finished for each: the sink's by id, the streams by count (Spiel gives no ids).
        let expected = accepted.len() + streams;
        wait_for(
            Duration::from_secs(120),
            Duration::from_millis(20),
            async || all.len() >= expected,
            || format!("{} of {expected} utterances finished", all.len()),
        )
        .await;
        // Quiet: the clients gone, the queue empty, freed memory handed back (after 2 s of quiet), and the
        // async runtime's idle blocking threads ended (they stay 10 s).
        tokio::time::sleep(Duration::from_secs(11)).await;
        daemon.service.check_running();
        held.push(holdings(daemon.service.pid()));
    }
    // Nothing more comes: no second Finished for anything.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        all.twice.lock().unwrap().is_empty(),
        "two Finished: {:?}",
        all.twice
    );
    let seen = all.seen.lock().unwrap().clone();
    for id in &accepted {
        assert!(seen.contains_key(id), "utterance {id} never finished");
    }
    assert_eq!(seen.len(), accepted.len() + streams);
    let mut reasons: HashMap<&str, usize> = HashMap::new();
    for r in seen.values() {
        *reasons.entry(r.as_str()).or_default() += 1;
    }
    daemon.service.check_running();
    let peak = peak_rss_mib(daemon.service.pid());
    eprintln!(
        "{} rounds of {clients} clients × {utterances}: {} utterances for the speakers, {streams} Spiel \
         streams, finished {reasons:?}; peak RSS {peak:.0} MiB ({before:.0} MiB at start); held once quiet \
         (RSS MiB, threads, fds) after each round: {held:?}; {:.1} s",
        held.len(),
        accepted.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        reasons.get("cancelled").copied().unwrap_or(0) > 0,
        "stalled readers were dropped"
    );
    assert!(
        peak < before + 256.0,
        "peak RSS {peak:.0} MiB, {before:.0} MiB at start"
    );
    let (first, last) = (held[0], held[held.len() - 1]);
    assert!(last.1 <= first.1 + 2, "threads grew: {held:?}");
    assert!(last.2 <= first.2 + 2, "open descriptors grew: {held:?}");
    assert!(last.0 <= first.0 + 48.0, "resident memory grew: {held:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_short() {
    soak(100, 2, 0x5eed, Duration::ZERO).await;
}

/// The long form, an hour by default (`KAZEIA_SOAK_SECONDS` sets it):
/// `cargo test --release -p kazeiad --test it soak_long -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak: 100 clients × 10 utterances a round, for an hour"]
async fn soak_long() {
    let seconds = std::env::var("KAZEIA_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3600);
    soak(100, 10, 0x5eed_1234, Duration::from_secs(seconds)).await;
}
