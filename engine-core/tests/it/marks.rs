//! Marks inside a text on the fixture models: the text is generated once, as without marks (the same greedy
//! codes, so the same audio bit for bit), and every mark is handed out once, in order, between the samples
//! where it is estimated to fall, never after the end.

use std::sync::Arc;

use crate::common::lm_fixtures::{fixture, golden_wav, ryan};
use crate::common::{assert_within, chunking};
use kazeia_engine::stream::{SessionControl, StreamConfig, StreamEvent};
use kazeia_engine::synth::{SynthOptions, Synthesizer, Voice};
use kazeia_engine::CpuBackend;

fn greedy(max_new_tokens: usize, chunk_chars: usize) -> SynthOptions {
    SynthOptions {
        greedy: true,
        seed: None,
        max_new_tokens: Some(max_new_tokens),
        chunk_chars,
        // Every chunk runs to the limit given (the tiny model rarely ends one), whatever its length.
        text_budget: false,
        ignore_eos: false,
    }
}

/// Byte offsets of the start of every word, as Orca marks them.
fn word_starts(text: &str) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut in_word = false;
    for (i, c) in text.char_indices() {
        if !c.is_whitespace() && !in_word {
            starts.push(i);
        }
        in_word = !c.is_whitespace();
    }
    starts
}

/// The session's audio, its marks (id, samples before it) and the number of generations.
fn speak(
    synth: &Synthesizer,
    text: &str,
    marks: &[usize],
    voice: &Voice,
    options: &SynthOptions,
    config: StreamConfig,
) -> (Vec<f32>, Vec<(usize, usize)>, usize) {
    let mut audio = Vec::new();
    let mut placed = Vec::new();
    let (report, _) = synth
        .synthesize_marked(
            text,
            marks,
            voice,
            options,
            config,
            &SessionControl::new(),
            &mut |event| {
                match event {
                    StreamEvent::Audio(samples) => audio.extend_from_slice(samples),
                    StreamEvent::Mark(id) => placed.push((id, audio.len())),
                }
                Ok(())
            },
        )
        .unwrap();
    (audio, placed, report.utterances)
}

fn assert_marks_once_in_order(placed: &[(usize, usize)], count: usize, total: usize) {
    let ids: Vec<usize> = placed.iter().map(|m| m.0).collect();
    assert_eq!(
        ids,
        (0..count).collect::<Vec<_>>(),
        "each mark once, in order"
    );
    assert!(placed.windows(2).all(|w| w[0].1 <= w[1].1), "{placed:?}");
    assert!(
        placed.iter().all(|m| m.1 <= total),
        "{placed:?} after {total}"
    );
}

#[test]
fn a_mark_before_every_word_leaves_the_official_audio_unchanged() {
    for case in ["shape_0b6", "shape_1b7"] {
        let synth = Synthesizer::load(&fixture(case), Arc::new(CpuBackend::new(2))).unwrap();
        let golden = golden_wav(case);
        let text = "Hello world.";
        let marks = word_starts(text);
        let (audio, placed, generations) = speak(
            &synth,
            text,
            &marks,
            &ryan(None),
            &greedy(24, 400),
            StreamConfig::default(),
        );
        assert_eq!(generations, 1, "{case}: one generation, not one per mark");
        assert_within(case, &audio, &golden, 1e-4);
        assert_marks_once_in_order(&placed, marks.len(), audio.len());
        assert_eq!(placed[0].1, 0, "the first word starts the audio");
        assert!(placed[1].1 > 0 && placed[1].1 < audio.len(), "{placed:?}");
    }
}

#[test]
fn marked_and_unmarked_text_give_the_same_codes_in_both_layouts_and_chunkings() {
    let synth = Synthesizer::load(&fixture("shape_0b6"), Arc::new(CpuBackend::new(2))).unwrap();
    let text =
        "Screen reader on. The quick brown fox, e.g. Dr. Fox, jumps 3.14 metres over the lazy dog!";
    let marks = word_starts(text);
    for non_streaming in [Some(true), Some(false)] {
        for (chunk_chars, first, later) in [(400, 1, 8), (40, 2, 3)] {
            let config = chunking(first, later, 1);
            let options = greedy(30, chunk_chars);
            let voice = ryan(non_streaming);
            let (plain, none, plain_generations) =
                speak(&synth, text, &[], &voice, &options, config);
            let (audio, placed, generations) =
                speak(&synth, text, &marks, &voice, &options, config);
            let what = format!("{non_streaming:?}, chunks of {chunk_chars}");
            assert!(none.is_empty());
            assert_eq!(generations, plain_generations, "{what}");
            // Short text is one generation; at 40 characters the sentences are chunked, not the words.
            if chunk_chars == 400 {
                assert_eq!(generations, 1, "{what}");
            }
            assert_eq!(audio, plain, "{what}: the marks changed the speech");
            assert_marks_once_in_order(&placed, marks.len(), audio.len());
        }
    }
}

#[test]
fn marks_at_the_ends_and_past_them_are_heard_there() {
    let synth = Synthesizer::load(&fixture("shape_0b6"), Arc::new(CpuBackend::new(2))).unwrap();
    let text = "One. Two.";
    let (audio, placed, _) = speak(
        &synth,
        text,
        &[0, 0, 5, text.len(), text.len() + 10],
        &ryan(None),
        &greedy(20, 400),
        StreamConfig::default(),
    );
    assert_marks_once_in_order(&placed, 5, audio.len());
    assert_eq!((placed[0].1, placed[1].1), (0, 0));
    assert_eq!((placed[3].1, placed[4].1), (audio.len(), audio.len()));
}

#[test]
fn a_stop_hands_out_no_mark_after_it() {
    let synth = Synthesizer::load(&fixture("shape_0b6"), Arc::new(CpuBackend::new(2))).unwrap();
    let text = "one two three four five six seven eight nine ten eleven twelve. ".repeat(4);
    let marks = word_starts(&text);
    let control = SessionControl::new();
    let mut events = Vec::new();
    let mut samples = 0;
    synth
        .synthesize_marked(
            &text,
            &marks,
            &ryan(None),
            &greedy(40, 70),
            StreamConfig::default(),
            &control,
            &mut |event| {
                match event {
                    StreamEvent::Audio(s) => samples += s.len(),
                    StreamEvent::Mark(id) => events.push(id),
                }
                if samples > 0 && events.len() >= 3 {
                    control.stop_async();
                }
                Ok(())
            },
        )
        .unwrap();
    assert!(
        events.len() >= 3 && events.len() < marks.len(),
        "{events:?}"
    );
    assert_eq!(events, (0..events.len()).collect::<Vec<_>>());
}
