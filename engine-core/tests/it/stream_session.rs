//! Streaming synthesis sessions on a fixture model: the streamed audio is the one-shot audio, stop silences
//! at once and ends generation, pause holds delivery until resume.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::lm_fixtures::{fixture, golden_wav, ryan};
use crate::common::{assert_within, chunking};
use kazeia_engine::stream::{SessionControl, StreamConfig};
use kazeia_engine::synth::{SynthOptions, Synthesizer};
use kazeia_engine::CpuBackend;

fn greedy(max_new_tokens: usize) -> SynthOptions {
    SynthOptions {
        greedy: true,
        seed: None,
        max_new_tokens: Some(max_new_tokens),
        chunk_chars: 400,
        // The official generation's limit alone, as the golden waveforms were made.
        text_budget: false,
        ignore_eos: false,
    }
}

#[test]
fn streamed_audio_equals_the_official_one_shot_waveform_for_any_chunking() {
    for case in ["shape_0b6", "shape_1b7"] {
        let synth = Synthesizer::load(&fixture(case), Arc::new(CpuBackend::new(2))).unwrap();
        let golden = golden_wav(case);
        for (first, later, parts) in [(1, 1, 2), (2, 8, 1), (3, 5, 4), (100, 100, 2)] {
            let config = StreamConfig {
                first_chunk_frames: first,
                chunk_frames: later,
                first_chunk_parts: parts,
                profile_decoder: false,
                batch: 1,
                ..StreamConfig::default()
            };
            let mut audio = Vec::new();
            let mut deliveries = 0;
            let control = SessionControl::new();
            let (report, _) = synth
                .synthesize(
                    "Hello world.",
                    &ryan(None),
                    &greedy(24),
                    config,
                    &control,
                    &mut |chunk| {
                        audio.extend_from_slice(chunk);
                        deliveries += 1;
                        Ok(())
                    },
                )
                .unwrap();
            assert_within(&format!("{case} {first}/{later}"), &audio, &golden, 1e-4);
            let frames = report.frames;
            // Chunks of `first` frames, then one frame more every third chunk up to `later`, the last one what is
            // left; the first comes in its parts (it has four 50 Hz columns per frame, more than the parts).
            let (mut chunks, mut left) = (0, frames);
            while left > 0 {
                left = left.saturating_sub(config.chunk_frames_at(chunks));
                chunks += 1;
            }
            let expected = chunks + parts - 1;
            assert_eq!(
                deliveries, expected,
                "{case} {first}/{later}: {frames} frames"
            );
            assert!(report.first_audio.is_some());
        }
    }
}

/// After the first chunk they grow by one frame every third chunk up to the largest, so that each is made while
/// the audio before it plays (a jump from one frame to eight left a long silence after the first sound).
#[test]
fn chunks_grow_by_one_frame_every_third_chunk_up_to_the_largest() {
    let config = StreamConfig::default();
    let sizes: Vec<usize> = (0..24).map(|i| config.chunk_frames_at(i)).collect();
    assert_eq!(
        sizes,
        [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5, 6, 6, 6, 7, 7, 7, 8, 8, 8]
    );
    assert_eq!(config.chunk_frames_at(1000), 8);
    // A first chunk larger than the largest later one: the later ones are the largest.
    let config = StreamConfig {
        first_chunk_frames: 12,
        chunk_frames: 5,
        ..StreamConfig::default()
    };
    assert_eq!(config.chunk_frames_at(0), 12);
    assert_eq!(config.chunk_frames_at(1), 5);
}

/// Runs `check` with one chunk generated at a time, and with four at once (`StreamConfig::batch`).
fn one_chunk_at_a_time_and_four_at_once(check: fn(usize)) {
    for batch in [1, 4] {
        check(batch);
    }
}

/// Long text that never runs out during the test.
fn long_text() -> String {
    "Good morning, how are you today? ".repeat(200)
}

#[test]
fn stop_silences_at_once_and_ends_generation_within_a_frame() {
    one_chunk_at_a_time_and_four_at_once(stop_silences);
}

fn stop_silences(batch: usize) {
    let synth = Synthesizer::load(&fixture("shape_0b6"), Arc::new(CpuBackend::new(2))).unwrap();
    let control = Arc::new(SessionControl::new());
    let delivered = Arc::new(AtomicUsize::new(0));
    let after_stop = Arc::new(AtomicUsize::new(0));
    let stopped_at = Arc::new(Mutex::new(None::<Instant>));

    let stopper = {
        let (control, delivered, stopped_at) =
            (control.clone(), delivered.clone(), stopped_at.clone());
        std::thread::spawn(move || {
            while delivered.load(Ordering::SeqCst) < 3 {
                std::thread::sleep(Duration::from_millis(1));
            }
            let t = Instant::now();
            control.stop();
            *stopped_at.lock().unwrap() = Some(t);
            t.elapsed()
        })
    };
    let options = SynthOptions {
        seed: Some(3),
        max_new_tokens: Some(50),
        ..greedy(50)
    };
    let config = chunking(1, 1, batch);
    let (report, _) = synth
        .synthesize(
            &long_text(),
            &ryan(None),
            &options,
            config,
            &control,
            &mut |_| {
                if stopped_at.lock().unwrap().is_some() {
                    after_stop.fetch_add(1, Ordering::SeqCst);
                }
                delivered.fetch_add(1, Ordering::SeqCst);
                Ok(())
            },
        )
        .unwrap();
    let returned = Instant::now();
    let stop_call = stopper.join().unwrap();
    let stop_began = stopped_at.lock().unwrap().unwrap();
    assert!(report.stopped);
    assert_eq!(
        after_stop.load(Ordering::SeqCst),
        0,
        "audio delivered after stop returned"
    );
    assert!(
        stop_call < Duration::from_millis(20),
        "stop took {stop_call:?}"
    );
    // Generation noticed the stop within a frame or so (a tiny model: well under 200 ms) and the session ended.
    let wind_down = returned - stop_began;
    assert!(
        wind_down < Duration::from_millis(500),
        "session ended {wind_down:?} after stop"
    );
    assert!(
        report.utterances < 20,
        "kept generating after stop: {} utterances",
        report.utterances
    );
}

#[test]
fn pause_holds_delivery_until_resume_and_loses_nothing() {
    one_chunk_at_a_time_and_four_at_once(pause_holds);
}

fn pause_holds(batch: usize) {
    let synth = Synthesizer::load(&fixture("shape_0b6"), Arc::new(CpuBackend::new(2))).unwrap();
    let text = "Hello world. Good morning, how are you today?";
    let config = chunking(1, 2, batch);
    let mut reference = Vec::new();
    synth
        .synthesize(
            text,
            &ryan(None),
            &greedy(20),
            config,
            &SessionControl::new(),
            &mut |c| {
                reference.extend_from_slice(c);
                Ok(())
            },
        )
        .unwrap();

    // The pause is requested from the first delivery (deterministic whatever the machine's load); a
    // thread resumes 300 ms later.
    let control = Arc::new(SessionControl::new());
    let log = Arc::new(Mutex::new(Vec::<(Instant, usize)>::new()));
    let mut resumer = None;
    let mut audio = Vec::new();
    synth
        .synthesize(text, &ryan(None), &greedy(20), config, &control, &mut |c| {
            audio.extend_from_slice(c);
            log.lock().unwrap().push((Instant::now(), c.len()));
            if resumer.is_none() {
                control.pause();
                let paused_at = Instant::now();
                let control = control.clone();
                resumer = Some(std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(300));
                    let resumed_at = Instant::now();
                    control.resume();
                    (paused_at, resumed_at)
                }));
            }
            Ok(())
        })
        .unwrap();
    let finished = Instant::now();
    let (paused_at, resumed_at) = resumer.expect("audio was delivered").join().unwrap();
    assert!(
        finished > resumed_at,
        "the session ended before the pause took effect"
    );
    assert_eq!(audio, reference, "pause changed the audio");
    // Apart from a delivery already under way when pause was called, nothing arrives while paused.
    let during: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(t, _)| *t > paused_at + Duration::from_millis(50) && *t < resumed_at)
        .cloned()
        .collect();
    assert!(
        during.is_empty(),
        "{} deliveries while paused",
        during.len()
    );
}

/// A batched session (`StreamConfig::batch`): a text of several chunks of different lengths, with marks,
/// hands out exactly what the sequential session does (greedy): the same audio chunks, bit for bit, and the
/// marks between the same samples, in order (the marks of a chunk placed with the speaking rate learned from
/// the chunks before it, as in a sequential session).
#[test]
fn a_batched_session_hands_out_what_a_sequential_one_does() {
    use kazeia_engine::stream::StreamEvent;
    #[derive(Debug, PartialEq)]
    enum Event {
        Audio(Vec<u32>),
        Mark(usize),
    }
    let text =
        "Hello world. How are you today, my old friend? Fine. The weather is rather nice this \
                morning, is it not? Yes.";
    let marks: Vec<usize> = ["world", "today", "Fine", "weather", "morning", "Yes"]
        .iter()
        .map(|w| text.find(w).unwrap())
        .collect();
    let options = SynthOptions {
        chunk_chars: 20,
        ..greedy(30)
    };
    // A new synthesizer each time: the speaking rate that places marks is learned from every session.
    let run = |batch: usize| {
        let synth = Synthesizer::load(&fixture("shape_0b6"), Arc::new(CpuBackend::new(2))).unwrap();
        let config = chunking(2, 3, batch);
        let mut events = Vec::new();
        let (report, _) = synth
            .synthesize_marked(
                text,
                &marks,
                &ryan(None),
                &options,
                config,
                &SessionControl::new(),
                &mut |event| {
                    events.push(match event {
                        StreamEvent::Audio(samples) => {
                            Event::Audio(samples.iter().map(|s| s.to_bits()).collect())
                        }
                        StreamEvent::Mark(id) => Event::Mark(id),
                    });
                    Ok(())
                },
            )
            .unwrap();
        (report, events)
    };
    let (sequential, expected) = run(1);
    assert!(
        sequential.utterances >= 4,
        "{} chunks",
        sequential.utterances
    );
    let marks_seen = expected
        .iter()
        .filter(|e| matches!(e, Event::Mark(_)))
        .count();
    assert_eq!(marks_seen, marks.len());
    for batch in [2, 3, 4] {
        let (report, events) = run(batch);
        assert_eq!(report.utterances, sequential.utterances, "batch {batch}");
        assert_eq!(report.frames, sequential.frames, "batch {batch}");
        assert_eq!(events.len(), expected.len(), "batch {batch}");
        assert!(events == expected, "batch {batch}: events differ");
    }
}

/// Marks that generation has not reached when it ends (here cut by the frame cap long before the speaking
/// rate predicted) are placed within its audio: each comes before the last of it, even with one-frame chunks
/// that would otherwise have handed it all out already.
#[test]
fn marks_left_when_generation_ends_come_before_its_last_audio() {
    use kazeia_engine::stream::StreamEvent;
    let text = "Hello world. How are you today, my old friend? Fine, thank you.";
    let words = [
        "world", "How", "today", "old", "friend", "Fine", "thank", "you.",
    ];
    let marks: Vec<usize> = words.iter().map(|w| text.find(w).unwrap()).collect();
    let synth = Synthesizer::load(&fixture("shape_0b6"), Arc::new(CpuBackend::new(2))).unwrap();
    for chunk_frames in [1, 2, 8] {
        let config = StreamConfig {
            first_chunk_frames: 1,
            chunk_frames,
            ..StreamConfig::default()
        };
        // (marks seen, samples) in order of delivery.
        let mut events: Vec<(Option<usize>, usize)> = Vec::new();
        let (report, _) = synth
            .synthesize_marked(
                text,
                &marks,
                &ryan(None),
                &greedy(12),
                config,
                &SessionControl::new(),
                &mut |event| {
                    events.push(match event {
                        StreamEvent::Audio(samples) => (None, samples.len()),
                        StreamEvent::Mark(id) => (Some(id), 0),
                    });
                    Ok(())
                },
            )
            .unwrap();
        assert_eq!(report.frames, 11, "the tiny model runs to the cap");
        let ids: Vec<usize> = events.iter().filter_map(|e| e.0).collect();
        assert_eq!(ids, (0..words.len()).collect::<Vec<_>>());
        let last_mark = events.iter().rposition(|e| e.0.is_some()).unwrap();
        let audio_after: usize = events[last_mark..].iter().map(|e| e.1).sum();
        assert!(
            audio_after > 0,
            "chunks of {chunk_frames}: the last mark came after all the audio"
        );
    }
}
