//! An utterance's pieces as the engine speaks them: a stretch of text of one prosody is one run — one
//! generation, with its own sentence melody — whatever marks lie inside it (Orca puts one before every word).
//! The marks ride along at their offsets in the run's text and are placed in its audio by the engine.

use std::collections::VecDeque;
use std::time::Duration;

use kazeia_text::ssml::{Piece, Prosody};

/// A mark inside a run: its piece, its name and its byte offset in the run's text.
#[derive(Clone, Debug, PartialEq)]
pub struct RunMark<'a> {
    pub piece: usize,
    pub name: &'a str,
    pub offset: usize,
}

/// One step of speaking an utterance.
#[derive(Clone, Debug, PartialEq)]
pub enum Step<'a> {
    /// Text to generate at once, with the marks inside it; `last_piece` is the last piece it covers.
    Run {
        text: String,
        prosody: Prosody,
        marks: Vec<RunMark<'a>>,
        last_piece: usize,
    },
    /// A mark with no text of its run to be placed in (next to a break, or in a text with nothing to say).
    Mark {
        piece: usize,
        name: &'a str,
    },
    Break {
        piece: usize,
        duration: Duration,
    },
}

/// Whether the run's text has anything to say (punctuation alone is silent).
pub fn speakable(text: &str) -> bool {
    text.chars().any(char::is_alphanumeric)
}

/// CJK text runs on without spaces between words.
fn wide(c: Option<char>) -> bool {
    c.is_some_and(|c| c >= '\u{2e80}')
}

/// Ends the open run, if any: marks still waiting go to its end; a run with nothing to say leaves its marks
/// as plain steps.
fn close<'a>(run: &mut Option<Step<'a>>, waiting: &mut Vec<(usize, &'a str)>) -> Vec<Step<'a>> {
    let mut out = Vec::new();
    if let Some(mut step) = run.take() {
        if let Step::Run {
            text,
            marks,
            last_piece,
            ..
        } = &mut step
        {
            for (piece, name) in waiting.drain(..) {
                marks.push(RunMark {
                    piece,
                    name,
                    offset: text.len(),
                });
                *last_piece = piece;
            }
            if !speakable(text) {
                out.extend(marks.drain(..).map(|m| Step::Mark {
                    piece: m.piece,
                    name: m.name,
                }));
                return out;
            }
        }
        out.push(step);
    }
    out.extend(
        waiting
            .drain(..)
            .map(|(piece, name)| Step::Mark { piece, name }),
    );
    out
}

/// The steps for `pieces[first..]` (piece indices stay those of `pieces`).
pub fn steps(pieces: &[Piece], first: usize) -> Vec<Step<'_>> {
    let mut out = Vec::new();
    let mut run: Option<Step> = None;
    // Marks waiting for the next text of their run: they sit at the start of its first word.
    let mut waiting: Vec<(usize, &str)> = Vec::new();
    let mut after_text = false;
    for (index, piece) in pieces.iter().enumerate().skip(first) {
        let text_before = std::mem::replace(&mut after_text, matches!(piece, Piece::Text { .. }));
        match piece {
            Piece::Text { text, prosody } => {
                // Text right after text is a long text cut into chunks (so that an interrupted one resumes
                // at the first chunk not heard): each is a run.
                let same = !text_before
                    && matches!(&run, Some(Step::Run { prosody: p, .. }) if p == prosody);
                if !same {
                    // Marks waiting at a change of prosody open the new run.
                    let held = std::mem::take(&mut waiting);
                    out.extend(close(&mut run, &mut waiting));
                    waiting = held;
                    run = Some(Step::Run {
                        text: String::new(),
                        prosody: *prosody,
                        marks: Vec::new(),
                        last_piece: index,
                    });
                }
                let Some(Step::Run {
                    text: run_text,
                    marks,
                    last_piece,
                    ..
                }) = &mut run
                else {
                    unreachable!("a run was just opened");
                };
                let wide_join = wide(run_text.chars().last()) && wide(text.chars().next());
                if !run_text.is_empty() && !wide_join {
                    run_text.push(' ');
                }
                for (piece, name) in waiting.drain(..) {
                    marks.push(RunMark {
                        piece,
                        name,
                        offset: run_text.len(),
                    });
                }
                run_text.push_str(text);
                *last_piece = index;
            }
            Piece::Mark(name) => waiting.push((index, name)),
            Piece::Break(duration) => {
                out.extend(close(&mut run, &mut waiting));
                out.push(Step::Break {
                    piece: index,
                    duration: *duration,
                });
            }
        }
    }
    out.extend(close(&mut run, &mut waiting));
    out
}

/// What a run hands out after the prosody filter, in order.
#[derive(Debug, PartialEq)]
pub enum Out<'s> {
    Audio(&'s [f32]),
    /// The run's mark of this index (into its `marks`).
    Mark(usize),
}

/// Places a run's marks in its filtered audio. The engine hands a mark out between the samples where it
/// falls; the prosody filter changes durations by 1 / rate (and holds back a few ms), so that point of the
/// input is heard at input / rate of the output.
pub struct Placement {
    rate: f64,
    input: u64,
    output: u64,
    pending: VecDeque<(u64, usize)>,
}

impl Placement {
    /// For a filter of speed `rate` (as clamped by the filter).
    pub fn new(rate: f32) -> Self {
        Placement {
            rate: f64::from(rate).max(1e-3),
            input: 0,
            output: 0,
            pending: VecDeque::new(),
        }
    }

    /// `n` more samples went into the filter.
    pub fn input(&mut self, n: usize) {
        self.input += n as u64;
    }

    /// Mark `index` came after the input so far.
    pub fn mark(&mut self, index: usize) {
        let at = (self.input as f64 / self.rate).round() as u64;
        let after = self.pending.back().map_or(0, |&(a, _)| a);
        self.pending.push_back((at.max(after), index));
    }

    /// Hands out `samples` (the filter's next output) with the marks due inside or before it.
    pub fn output(
        &mut self,
        samples: &[f32],
        emit: &mut dyn FnMut(Out) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let mut rest = samples;
        loop {
            while let Some(&(at, index)) = self.pending.front() {
                if at > self.output {
                    break;
                }
                self.pending.pop_front();
                emit(Out::Mark(index))?;
            }
            if rest.is_empty() {
                return Ok(());
            }
            let take = self.pending.front().map_or(rest.len(), |&(at, _)| {
                ((at - self.output) as usize).min(rest.len())
            });
            let (now, later) = rest.split_at(take);
            emit(Out::Audio(now))?;
            self.output += take as u64;
            rest = later;
        }
    }

    /// The run's audio is all out: the marks left are at its end.
    pub fn finish(
        &mut self,
        emit: &mut dyn FnMut(Out) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        while let Some((_, index)) = self.pending.pop_front() {
            emit(Out::Mark(index))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kazeia_text::ssml::parse_ssml;

    #[test]
    fn a_mark_before_every_word_is_one_run() {
        // What Orca 43 sends for "Screen reader on.".
        let pieces = parse_ssml(
            "<speak><mark name=\"0:6\"/>Screen <mark name=\"7:13\"/>reader <mark name=\"14:17\"/>on.</speak>",
        )
        .unwrap();
        let steps = steps(&pieces, 0);
        let [Step::Run {
            text,
            marks,
            last_piece,
            ..
        }] = steps.as_slice()
        else {
            panic!("{steps:?}");
        };
        assert_eq!(text, "Screen reader on.");
        let at: Vec<(&str, usize)> = marks.iter().map(|m| (m.name, m.offset)).collect();
        assert_eq!(at, [("0:6", 0), ("7:13", 7), ("14:17", 14)]);
        assert_eq!(*last_piece, pieces.len() - 1);
    }

    #[test]
    fn breaks_and_prosody_changes_end_runs_and_marks_stay_in_order() {
        let pieces = parse_ssml(
            "<speak>One.<mark name=\"a\"/> Two.<break time=\"100ms\"/><mark name=\"b\"/>Three \
             <prosody rate=\"2\"><mark name=\"c\"/>fast</prosody><mark name=\"d\"/>…<mark name=\"e\"/></speak>",
        )
        .unwrap();
        let steps = steps(&pieces, 0);
        let mut order = Vec::new();
        let mut texts = Vec::new();
        for step in &steps {
            match step {
                Step::Run { text, marks, .. } => {
                    texts.push(text.as_str());
                    order.extend(marks.iter().map(|m| m.name));
                }
                Step::Mark { name, .. } => order.push(name),
                Step::Break { .. } => order.push("break"),
            }
        }
        assert_eq!(order, ["a", "break", "b", "c", "d", "e"]);
        assert_eq!(texts, ["One. Two.", "Three", "fast"]);
        // Resumed from the second mark: the pieces before are not said again.
        let b = pieces
            .iter()
            .position(|p| *p == Piece::Mark("b".into()))
            .unwrap();
        assert!(
            matches!(super::steps(&pieces, b)[0], Step::Run { ref text, .. } if text == "Three")
        );
    }

    #[test]
    fn chunks_of_a_long_text_stay_runs_of_their_own() {
        let text = |t: &str| Piece::Text {
            text: t.into(),
            prosody: Prosody::NEUTRAL,
        };
        let pieces = [
            text("First chunk."),
            text("Second chunk."),
            Piece::Mark("m".into()),
            text("Third."),
        ];
        let runs: Vec<String> = steps(&pieces, 0)
            .into_iter()
            .map(|s| match s {
                Step::Run { text, marks, .. } => format!("{text}/{}", marks.len()),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(runs, ["First chunk./0", "Second chunk. Third./1"]);
    }

    #[test]
    fn cjk_words_are_joined_without_a_space() {
        let pieces = parse_ssml("<mark name=\"1\"/>你好<mark name=\"2\"/>世界").unwrap();
        let steps = steps(&pieces, 0);
        let [Step::Run { text, marks, .. }] = steps.as_slice() else {
            panic!("{steps:?}");
        };
        assert_eq!(text, "你好世界");
        assert_eq!(marks[1].offset, "你好".len());
    }

    #[test]
    fn marks_follow_the_filter_s_change_of_duration() {
        let mut log = Vec::new();
        let mut emit = |o: Out| {
            log.push(match o {
                Out::Audio(s) => format!("a{}", s.len()),
                Out::Mark(i) => format!("m{i}"),
            });
            Ok(())
        };
        // Twice as fast: a mark after 100 input samples is heard after 50 output samples.
        let mut p = Placement::new(2.0);
        p.mark(0);
        p.input(100);
        p.mark(1);
        p.output(&[0.0; 30], &mut emit).unwrap();
        p.input(100);
        p.mark(2);
        p.output(&[0.0; 40], &mut emit).unwrap();
        p.finish(&mut emit).unwrap();
        assert_eq!(log, ["m0", "a30", "a20", "m1", "a20", "m2"]);
    }
}
