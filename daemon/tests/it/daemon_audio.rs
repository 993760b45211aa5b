//! The daemon's speech as heard at a headless PipeWire's null sink (recorded by `pw-record`): how a stop
//! ends it, and how it rides out a restart of the audio server.

use crate::common::{client, loud_seconds, priority, spiel, wait_for, Finishes, TestDaemon};

use std::process::Command;
use std::time::{Duration, Instant};

use kazeia_tests::services::{PipeWire, Recorder};

/// Louder than this is speech.
const THRESHOLD: f32 = 0.01;

/// Waits (at most 30 s) until `rec` hears speech that came after `asked`.
async fn wait_for_speech(rec: &Recorder, asked: Instant, daemon: &TestDaemon) {
    wait_for(
        Duration::from_secs(30),
        Duration::from_millis(20),
        async || rec.sound_since(asked, THRESHOLD).is_some(),
        || format!("no speech:\n{}", daemon.service.log()),
    )
    .await;
}

/// Said twice by the slow-machine tests: too long for the short-text cache, so said again it is generated
/// again (greedy: the same audio).
const TWO_SENTENCES: &str =
    "The first sentence is here. And here is a second one, a little longer than the first.";

/// The lines of `log` that contain any of `words`.
fn lines_with<'a>(log: &'a str, words: &[&str]) -> Vec<&'a str> {
    log.lines()
        .filter(|l| words.iter().any(|w| l.contains(w)))
        .collect()
}

/// The largest step between neighbouring samples.
fn largest_step(samples: &[f32]) -> f32 {
    samples
        .windows(2)
        .map(|w| (w[1] - w[0]).abs())
        .fold(0.0, f32::max)
}

/// A stop during speech ends it with a fade, not a step (a click), within 20 ms of the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_speech_fades_out_at_once() {
    let daemon = TestDaemon::pipewire("daemon-stop-fade", "[generation]\ngreedy = true\n");
    let (_connection, api) = client(&daemon.bus).await;
    let mut finishes = Finishes::new(&api).await;
    let rec = Recorder::start(daemon.pw());
    let asked = Instant::now();
    let id = api
        .speak(
            &"Hello world, this is a test. ".repeat(100),
            priority("message"),
        )
        .await
        .unwrap();
    wait_for_speech(&rec, asked, &daemon).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stop_at = Instant::now();
    assert_eq!(api.stop_everyone().await.unwrap(), 1);
    assert_eq!(finishes.of(id, Duration::from_secs(5)).await, "stopped");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rec = rec.stop();

    let (first, end) = rec.sound_span(THRESHOLD).expect("no speech was recorded");
    let ms = |ms: usize| ms * rec.rate as usize / 1000;
    let peak = |s: &[f32]| s.iter().fold(0.0f32, |m, s| m.max(s.abs()));
    let own = largest_step(&rec.samples[first..end - ms(30)]);
    let at_cut = largest_step(&rec.samples[end - ms(30)..(end + ms(30)).min(rec.samples.len())]);
    // The speech is noise-like (a random model): its own steps are as large as a cut's. What tells a fade
    // from a cut is the level of the last millisecond of sound against the speech just before it.
    let last_ms = peak(&rec.samples[end - ms(1)..end]);
    let before = peak(&rec.samples[end - ms(35)..end - ms(5)]);
    let silent_after = rec.arrival(end).unwrap().saturating_duration_since(stop_at);
    eprintln!(
        "stop during speech: largest step at the cut {at_cut:.4}, the speech's own {own:.4}; the last ms of \
         sound peaks at {last_ms:.4}, the 30 ms before at {before:.4}; last sound arrived {:.1} ms after \
         the Stop call",
        silent_after.as_secs_f64() * 1e3
    );
    assert!(
        at_cut <= own,
        "a step of {at_cut} at the cut; the speech steps by {own} at most"
    );
    // The sink's own bound is 20 ms (`audio_sinks`); the D-Bus call and a loaded machine come on top.
    assert!(
        silent_after <= Duration::from_millis(50),
        "{silent_after:?}"
    );
    assert!(
        last_ms <= before / 4.0,
        "the sound ends at {last_ms} after speech at {before}: cut, not faded"
    );
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
    // Greedy: the same audio every time (about 1.1 s per chunk of 400 characters).
    let mut daemon = TestDaemon::pipewire("daemon-pw-restart", "[generation]\ngreedy = true\n");
    let (connection, api) = client(&daemon.bus).await;
    let long = "Hello world, this is a test. ".repeat(100);
    let short = "Said while the audio server was away.";
    let whole_long = spiel(&connection, &long).await.unwrap();
    let whole_short = spiel(&connection, short).await.unwrap();
    let (loud_long, loud_short) = (
        loud_seconds(&whole_long, 24_000, THRESHOLD),
        loud_seconds(&whole_short, 24_000, THRESHOLD),
    );
    let whole = loud_long + loud_short;

    let mut finishes = Finishes::new(&api).await;
    let before = Recorder::start(daemon.pw());
    let asked = Instant::now();
    // Messages: the second does not cancel the first (as a second text would).
    let id = api.speak(&long, priority("message")).await.unwrap();
    wait_for_speech(&before, asked, &daemon).await;
    // Heard for a while, then the server dies.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    daemon.pw.as_mut().unwrap().kill_server();
    let before = before.stop();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let queued = api.speak(short, priority("message")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The daemon is held while the new server and its recorder start, so that the recorder hears all
    // that follows (left running, it would take up the speech as soon as the server's socket is there).
    signal(daemon.service.pid(), "STOP");
    daemon.pw = None;
    daemon.pw = Some(PipeWire::start(&daemon.bus));
    let after = Recorder::start(daemon.pw());
    let resumed = Instant::now();
    signal(daemon.service.pid(), "CONT");
    let gap = Instant::now() - resumed;
    assert_eq!(
        finishes.of(id, Duration::from_secs(60)).await,
        "done",
        "{}",
        daemon.service.log()
    );
    assert_eq!(finishes.of(queued, Duration::from_secs(30)).await, "done");
    let back = after.sound_since(resumed, THRESHOLD);
    let after = after.stop();

    let heard_before = loud_seconds(&before.samples, before.rate, THRESHOLD);
    let heard_after = loud_seconds(&after.samples, after.rate, THRESHOLD);
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
    let log = daemon.service.log();
    assert!(
        log.contains("waits up to 30 s for the audio server"),
        "{log}"
    );
    assert!(log.contains("the utterance goes on"), "{log}");
}

/// Milliseconds of silence (10 ms windows with no sample louder than [`THRESHOLD`]) between the first and the
/// last sound of a recording: the gaps a listener hears inside an utterance of noise-like speech.
fn gaps_ms(samples: &[f32], rate: u32) -> f64 {
    let window = rate as usize / 100;
    let loud: Vec<bool> = samples
        .chunks(window)
        .map(|w| w.iter().any(|s| s.abs() > THRESHOLD))
        .collect();
    let (Some(first), Some(last)) = (loud.iter().position(|&l| l), loud.iter().rposition(|&l| l))
    else {
        return 0.0;
    };
    (loud[first..=last].iter().filter(|&&l| !l).count() * 10) as f64
}

/// What a listener heard of one utterance: when its first sound came (from the request), how long it sounded
/// from first to last sound, and the milliseconds of gaps inside.
#[derive(Debug, Clone, Copy)]
struct Heard {
    first: Duration,
    seconds: f64,
    gaps_ms: f64,
}

/// A daemon on a machine simulated as `slowness` (`KAZEIA_TEST_SLOW`: a real-time factor, and optionally
/// `+MS` a chunk), with `extra` configuration
/// and `env`, says `first` (unplanned: nothing learnt yet) then `second` (planned from what the first taught):
/// what was heard each time, and the daemon's log.
async fn said_twice(
    slowness: &str,
    (first, second): (&str, &str),
    extra: &str,
    env: &[(&str, &str)],
) -> ([Heard; 2], String) {
    let mut setup = TestDaemon::setup(
        "daemon-slow-machine",
        &format!("[generation]\ngreedy = true\n{extra}"),
    )
    .speaking()
    .env("KAZEIA_TEST_SLOW", slowness)
    .env("RUST_LOG", "info,kazeiad::player=debug");
    for (key, value) in env {
        setup = setup.env(key, value);
    }
    let daemon = setup.pipewire();
    let (_connection, api) = client(&daemon.bus).await;
    let mut finishes = Finishes::new(&api).await;
    let mut heard = Vec::new();
    for text in [first, second] {
        let rec = Recorder::start(daemon.pw());
        let asked = Instant::now();
        let id = api.speak(text, priority("message")).await.unwrap();
        assert_eq!(finishes.of(id, Duration::from_secs(600)).await, "done");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let rec = rec.stop();
        let (start, end) = rec.sound_span(THRESHOLD).expect("no speech was recorded");
        heard.push(Heard {
            first: rec
                .arrival(start)
                .map_or(Duration::ZERO, |t| t.saturating_duration_since(asked)),
            seconds: (end - start) as f64 / rec.rate as f64,
            gaps_ms: gaps_ms(&rec.samples, rec.rate),
        });
    }
    ([heard[0], heard[1]], daemon.service.log())
}

/// On a machine slower than real time (simulated: each chunk delivered after 1.5 times its duration), the first
/// utterance plays as it comes and is heard with gaps; it teaches the daemon this machine's speed, and the same
/// text said again starts later and is heard without a gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slower_than_real_time_speech_starts_later_and_has_no_gap() {
    let ([unplanned, planned], log) =
        said_twice("1.5", (TWO_SENTENCES, TWO_SENTENCES), "", &[]).await;
    let plan = lines_with(&log, &["real-time factor"]);
    eprintln!("simulated RTF 1.5: unplanned {unplanned:?}, planned {planned:?}\n{plan:?}");
    assert!(
        unplanned.gaps_ms > 100.0,
        "the first utterance, played as it came, had no gap to remove: {unplanned:?}\n{log}"
    );
    assert!(
        planned.gaps_ms <= 20.0,
        "the planned utterance has gaps: {planned:?}\n{log}"
    );
    assert!(
        planned.first > unplanned.first,
        "it should start later to play without a gap: {planned:?}"
    );
}

/// Just below real time (simulated: each chunk after 0.6 times its duration plus 60 ms, a decoder's cost per
/// chunk, about 0.8 overall) the steady rate asks for no hold, yet the first small chunks fall behind: the first
/// utterance, played as it came, is heard with gaps; it teaches the daemon what its first seconds needed, and the
/// next is heard without a gap, starting only a little later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn just_below_real_time_the_first_chunks_leave_no_gap() {
    let ([unplanned, planned], log) =
        said_twice("0.6+60", (TWO_SENTENCES, TWO_SENTENCES), "", &[]).await;
    let plan = lines_with(&log, &["playing after", "real-time factor"]);
    eprintln!(
        "simulated 0.6 + 60 ms a chunk: unplanned {unplanned:?}, planned {planned:?}\n{plan:?}"
    );
    assert!(
        unplanned.gaps_ms > 30.0,
        "the first utterance, played as it came, had no gap to remove: {unplanned:?}\n{log}"
    );
    assert!(
        planned.gaps_ms <= 20.0,
        "the planned utterance has gaps: {planned:?}\n{log}"
    );
    assert!(
        // The sound's span holds its gaps.
        (planned.seconds - (unplanned.seconds - unplanned.gaps_ms / 1e3)).abs() < 0.1,
        "not the same speech twice: {unplanned:?}, {planned:?}"
    );
    assert!(
        planned.first < unplanned.first + Duration::from_millis(1200),
        "held far longer than the first chunks need: {planned:?}\n{log}"
    );
}

/// The long form (`cargo test -p kazeiad --test it slow_machines -- --ignored --nocapture`): at
/// simulated real-time factors 0.5, 1.0, 1.5 and 2.0, a sentence of 2 s and a text of 30 s (the random fixture
/// made to speak up to its frame cap, `KAZEIA_TEST_IGNORE_EOS`), each said first unplanned, then planned; the
/// planned one is heard without a gap, and faster than real time it starts as soon as unplanned. Prints the
/// table `docs/playback-plan.md` quotes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes: the long form of the slow-machine test"]
async fn slow_machines_hear_no_gap_at_any_rate() {
    let long = "The morning train was late again. She opened the window and looked outside. Three birds sat on \
        the fence. A car passed slowly down the wet road. Somebody was cooking onions next door. The radio \
        played an old song about the sea. He counted the coins twice. It was going to rain all afternoon. The \
        letter had no stamp on it. They walked to the bridge and back. The museum closes at five on Sundays. \
        Please remember to water the plants. My brother fixed the bicycle chain. The soup needed a little \
        more salt. We watched the boats until it got dark.";
    // Each chunk of text speaks `max_frames` frames: one chunk of 2 s, two of 15 s.
    let cases = [
        (
            "sentence",
            ("Here is a short sentence.", "Here is another sentence."),
            "max_frames = 25\n",
        ),
        ("long text", (long, long), "max_frames = 188\n"),
    ];
    let mut table = String::from(
        "| RTF | text | unplanned: first sound, gaps | planned: first sound, gaps |\n|---|---|---|---|\n",
    );
    let mut failures = Vec::new();
    for rtf in [0.5, 1.0, 1.5, 2.0] {
        for (name, texts, extra) in cases {
            let ([unplanned, planned], log) = said_twice(
                &rtf.to_string(),
                texts,
                extra,
                &[("KAZEIA_TEST_IGNORE_EOS", "1")],
            )
            .await;
            table += &format!(
                "| {rtf} | {name} ({:.1} s) | {:.2} s, {:.0} ms | {:.2} s, {:.0} ms |\n",
                planned.seconds,
                unplanned.first.as_secs_f64(),
                unplanned.gaps_ms,
                planned.first.as_secs_f64(),
                planned.gaps_ms
            );
            if planned.gaps_ms > 20.0 {
                failures.push(format!("RTF {rtf}, {name}: {planned:?}\n{log}"));
            }
            if rtf < 1.0 && planned.first > unplanned.first + Duration::from_millis(100) {
                failures.push(format!(
                    "RTF {rtf}, {name}: started later than needed: {planned:?}"
                ));
            }
        }
    }
    eprintln!("{table}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
