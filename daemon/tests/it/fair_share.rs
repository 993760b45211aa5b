//! More connections or slow reading buy a client no more of the daemon (issue 40, items 2 and 3): `kazeiad`
//! on a private `dbus-daemon` with the tiny fixture model, its clients real processes as the bus sees them
//! (each "other client" connects from a process of its own, see `common::connect_as_new_process`; several
//! connections of the test process are one client).
//!
//! - Four processes queue 64 long Spiel requests each, two reading 4 KiB every 4 s and two never: a newcomer's
//!   first audio still comes within a second, every time it asks.
//! - One process's four connections, each streaming at real time, hold one stream, not four.
//! - Six connections of one process × 64 `important`: 64 are accepted in all, and another client's
//!   `message` is spoken.
//! - Spiel requests leave the room kept for `important` and `message`.

use crate::common;

use std::io::Read;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use common::*;
use kazeia_spiel::{Chunk, SpielReader};

/// Ten seconds of silence after a word: a stream that fills a pipe (1.4 s of audio) at once.
const LONG: &str = "<speak>Long.<break time=\"10s\"/>Over.</speak>";
/// Three seconds of it.
const THREE_SECONDS: &str = "<speak>Long.<break time=\"3s\"/>Over.</speak>";

/// Audio bytes a second: 24 kHz S16 mono.
const REAL_TIME: f64 = 48_000.0;

/// Reads a Spiel stream to its end; the time from `asked` to the first audio chunk, if any came.
fn first_audio_after(reader: std::io::PipeReader, asked: Instant) -> Option<Duration> {
    let mut stream = SpielReader::new(reader).ok()?;
    let mut first = None;
    while let Some(chunk) = stream.next_chunk().expect("a well-formed Spiel stream") {
        if matches!(chunk, Chunk::Audio(_)) && first.is_none() {
            first = Some(asked.elapsed());
        }
    }
    first
}

/// Makes the test's own read end non-blocking (the daemon's end is another file description).
fn nonblocking(reader: &std::io::PipeReader) {
    // SAFETY: fcntl with integer arguments on a valid fd.
    unsafe {
        let flags = libc::fcntl(reader.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(reader.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
}

/// How many requests each hostile client queues: the 64, or `KAZEIA_FAIR_REQUESTS`.
fn hostile_requests() -> usize {
    std::env::var("KAZEIA_FAIR_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_is_heard_within_a_second_while_slow_readers_hold_the_streams() {
    // Room for all 4 × 64 (the default bound would refuse some of them, which is the next test's concern).
    let mut daemon = TestDaemon::null(
        "fair-slow-readers",
        "[generation]\nmax_frames = 6\n[queue]\nmax_utterances = 1024\n",
    );

    // Four processes, 64 long requests each: two read 4 KiB from each pipe every 4 s, two never read.
    let per_client = hostile_requests();
    let mut hostiles = Vec::new();
    for h in 0..4 {
        let connection = connect(&daemon.bus).await;
        let mut pipes = Vec::new();
        for _ in 0..per_client {
            let reader = synthesize(&connection, LONG, true).await.unwrap();
            nonblocking(&reader);
            pipes.push(reader);
        }
        let trickle = h < 2;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut block = vec![0u8; 4096];
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    if trickle {
                        for pipe in pipes.iter_mut() {
                            let _ = pipe.read(&mut block);
                        }
                    }
                    std::thread::sleep(Duration::from_secs(4));
                }
                pipes
            })
        };
        hostiles.push((connection, stop, reader));
    }
    eprintln!("4 clients queued {per_client} long Spiel requests each (2 trickle, 2 never read)");
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A newcomer (a screen reader): each of its messages is heard within a second.
    let newcomer = connect(&daemon.bus).await;
    let mut firsts = Vec::new();
    for n in 0..6 {
        let asked = Instant::now();
        let reader = synthesize(&newcomer, &format!("Message {n}."), false)
            .await
            .unwrap();
        let first = tokio::time::timeout(
            Duration::from_secs(20),
            tokio::task::spawn_blocking(move || first_audio_after(reader, asked)),
        )
        .await
        .unwrap_or_else(|_| panic!("message {n}: no end of its stream within 20 s"))
        .unwrap()
        .unwrap_or_else(|| panic!("message {n}: no audio"));
        firsts.push(first);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let ms: Vec<String> = firsts
        .iter()
        .map(|d| format!("{:.0}", d.as_secs_f64() * 1e3))
        .collect();
    eprintln!("newcomer's first audio, ms: {}", ms.join(", "));
    let worst = firsts.iter().max().unwrap();
    assert!(
        *worst < Duration::from_secs(1),
        "a newcomer waited {worst:?} for its first audio ({ms:?} ms)"
    );
    daemon.service.check_running();
    let log = daemon.service.log();
    assert!(
        log.contains("does not keep up"),
        "slow readers were dropped:\n{log}"
    );
    for (_connection, stop, reader) in hostiles {
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        drop(reader);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_has_one_stream_however_many_connections_it_opens() {
    let daemon = TestDaemon::null(
        "fair-one-stream",
        "[generation]\nmax_frames = 6\n[queue]\nspiel_streams = 4\n",
    );

    // One app, four connections, each streaming three seconds read at real time.
    let started = Instant::now();
    let mut readers = Vec::new();
    let mut connections = Vec::new();
    for _ in 0..4 {
        let connection = connect_in_this_process(&daemon.bus).await;
        let reader = synthesize(&connection, THREE_SECONDS, true).await.unwrap();
        readers.push(tokio::task::spawn_blocking(move || {
            let mut stream = SpielReader::new(reader).ok();
            let mut first = None;
            let mut bytes = 0usize;
            while let Some(Ok(Some(chunk))) = stream.as_mut().map(|s| s.next_chunk()) {
                if let Chunk::Audio(pcm) = chunk {
                    first.get_or_insert_with(Instant::now);
                    bytes += pcm.len();
                    // Played as it is read.
                    let due = Duration::from_secs_f64(bytes as f64 / REAL_TIME);
                    if let Some(wait) = due.checked_sub(first.unwrap().elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
            }
            first
        }));
        connections.push(connection);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Another app's message starts at once: three stream slots are free.
    let other = connect(&daemon.bus).await;
    let asked = Instant::now();
    let reader = synthesize(&other, "Hello.", false).await.unwrap();
    let first = tokio::task::spawn_blocking(move || first_audio_after(reader, asked))
        .await
        .unwrap()
        .expect("audio");
    eprintln!(
        "another client's first audio after {:.0} ms, while one app streams from 4 connections",
        first.as_secs_f64() * 1e3
    );
    assert!(first < Duration::from_secs(1), "{first:?}");

    // The app's streams came one after the other, not side by side: each begins once the one before has
    // been written, 3 s of audio less the 1.4 s its pipe holds (side by side they would begin together).
    let mut firsts = Vec::new();
    for reader in readers {
        firsts.push(reader.await.unwrap().expect("each stream has audio"));
    }
    firsts.sort();
    let offsets: Vec<f64> = firsts
        .iter()
        .map(|t| (*t - started).as_secs_f64())
        .collect();
    eprintln!("the app's four streams began at {offsets:.2?} s");
    for pair in firsts.windows(2) {
        assert!(
            pair[1] - pair[0] > Duration::from_secs(1),
            "two streams of one process at once: {offsets:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_connections_of_one_process_buy_no_more_queue() {
    let daemon = TestDaemon::null("fair-six-connections", "[generation]\nmax_frames = 6\n");

    // Six connections of this process, each holding its own speech (so that it all stays queued) and
    // sending 64 importants.
    let (mut accepted, mut refused) = (0, 0);
    let mut flood = Vec::new();
    for _ in 0..6 {
        let connection = connect_in_this_process(&daemon.bus).await;
        let api = proxy(&connection).await;
        api.pause().await.unwrap();
        for n in 0..64 {
            match api
                .speak(&format!("Important {n}."), priority("important"))
                .await
            {
                Ok(_) => accepted += 1,
                Err(e) => {
                    let e = e.to_string();
                    assert!(
                        e.contains("QueueFull") && e.contains("max_per_client"),
                        "{e}"
                    );
                    refused += 1;
                }
            }
        }
        flood.push((connection, api));
    }
    eprintln!("6 connections × 64 important: {accepted} accepted, {refused} refused");
    assert_eq!(
        accepted, 64,
        "one process is one client: [queue] max_per_client"
    );

    // Another client's message is accepted and spoken.
    let (_other, other_api) = client(&daemon.bus).await;
    let mut finishes = Finishes::new(&other_api).await;
    let id = other_api
        .speak("Another client's message.", priority("message"))
        .await
        .expect("another client's message is accepted");
    assert_eq!(finishes.of(id, Duration::from_secs(30)).await, "done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spiel_requests_leave_the_room_kept_for_important_and_message() {
    // 16 in all, a quarter (4) kept for the speakers' important and message speech.
    let daemon = TestDaemon::null(
        "fair-spiel-room",
        "[generation]\nmax_frames = 6\n[queue]\nmax_utterances = 16\nmax_per_client = 4\n",
    );

    // Four processes send four long Spiel requests each, held open unread.
    let (mut pipes, mut refused) = (Vec::new(), 0);
    let mut clients = Vec::new();
    for _ in 0..4 {
        let connection = connect(&daemon.bus).await;
        for _ in 0..4 {
            match synthesize(&connection, LONG, true).await {
                Ok(reader) => pipes.push(reader),
                Err(e) => {
                    assert!(e.to_string().contains("QueueFull"), "{e}");
                    refused += 1;
                }
            }
        }
        clients.push(connection);
    }
    eprintln!(
        "16 Spiel requests: {} accepted, {refused} refused",
        pipes.len()
    );
    assert_eq!(pipes.len(), 12, "the Spiel requests took the kept room");

    // An own-API message and an important from another client are accepted and spoken.
    let (_other, api) = client(&daemon.bus).await;
    let mut finishes = Finishes::new(&api).await;
    for p in ["message", "important"] {
        let id = api
            .speak(&format!("An {p} among Spiel floods."), priority(p))
            .await
            .unwrap_or_else(|e| panic!("{p} refused: {e}"));
        assert_eq!(finishes.of(id, Duration::from_secs(30)).await, "done");
    }
}
