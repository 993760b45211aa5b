//! Where index marks inside a text fall in the audio generated for it, without cutting the text there.
//!
//! A text with marks is spoken as one generation, so its prosody is the text's own. The model does not say
//! which frame speaks which token (its text is wholly in the prompt in the non-streaming layout, and in the
//! streaming layout it reads one token per 80 ms frame, far ahead of the speech), so a mark's place is
//! estimated from the generation: the text before the mark is weighed by how long it takes to say
//! ([`speech_weight`]: letters, syllable-sized CJK characters, digits, pauses at punctuation), and the mark
//! falls at that share of the generated length. The length is known once the model ends the utterance (EOS);
//! until then it is predicted from the speaking rate learned from earlier generations of this model
//! ([`SpeakingRate`]), so a mark is placed as soon as generation reaches it and is heard on time.
//! Places are monotonic and never after the end of the generated audio.

use std::sync::Mutex;

/// How long `c` takes to say, in units of about one letter.
fn char_weight(c: char) -> f64 {
    if c.is_whitespace() {
        1.0
    } else if c.is_numeric() {
        // A digit is a word or part of one ("two thousand and…").
        2.5
    } else if c.is_alphabetic() {
        // CJK, kana, hangul: a syllable each.
        if c >= '\u{2e80}' {
            3.0
        } else {
            1.0
        }
    } else if matches!(
        c,
        '.' | '!' | '?' | '。' | '！' | '？' | '…' | '؟' | '।' | '\n'
    ) {
        4.0
    } else if matches!(
        c,
        ',' | ';' | ':' | '，' | '；' | '：' | '、' | '—' | '،' | '؛'
    ) {
        2.0
    } else {
        // Other symbols: "@" is "at", quotes and brackets are silent; about one letter on average.
        1.0
    }
}

/// How long `text` takes to say, in units of about one letter (see `char_weight`).
pub fn speech_weight(text: &str) -> f64 {
    text.chars().map(char_weight).sum()
}

/// The marks inside one prompt's text: for each, its id and the share of the text's speech before it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MarkPlan {
    /// `(id, share)` in text order, share in `0..=1`.
    pub marks: Vec<(usize, f64)>,
    /// [`speech_weight`] of the whole text.
    pub weight: f64,
}

impl MarkPlan {
    /// Marks at byte offsets of `text` (`(id, offset)`, in order; an offset past the end means the end).
    pub fn new(text: &str, marks: &[(usize, usize)]) -> Self {
        let weight = speech_weight(text);
        let marks = marks
            .iter()
            .map(|&(id, offset)| {
                let mut at = offset.min(text.len());
                while !text.is_char_boundary(at) {
                    at -= 1;
                }
                let share = if weight > 0.0 {
                    speech_weight(&text[..at]) / weight
                } else {
                    0.0
                };
                (id, share.clamp(0.0, 1.0))
            })
            .collect();
        MarkPlan { marks, weight }
    }
}

/// Frames per unit of [`speech_weight`] of one model's voice, learned from generations that ended by
/// themselves; shared by all sessions of the model.
pub struct SpeakingRate(Mutex<f64>);

/// About 15 letters a second, at 12.5 frames a second: the pace of ordinary read speech.
const DEFAULT_FRAMES_PER_UNIT: f64 = 12.5 / 15.0;

impl Default for SpeakingRate {
    fn default() -> Self {
        SpeakingRate(Mutex::new(DEFAULT_FRAMES_PER_UNIT))
    }
}

impl SpeakingRate {
    pub fn frames_per_unit(&self) -> f64 {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A generation of `frames` for text of `weight` ended by itself: move the estimate towards it (texts
    /// of a word or two say little about the pace, so each counts by its weight).
    pub fn learn(&self, frames: usize, weight: f64) {
        if weight < 1.0 || frames == 0 {
            return;
        }
        let observed = frames as f64 / weight;
        let blend = (weight / 200.0).clamp(0.02, 0.5);
        let mut rate = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *rate += blend * (observed - *rate);
    }
}

/// Places one generation's marks as its frames come: each at its estimated frame (fractional, from the start
/// of this generation's audio) once generation has reached it, the rest when generation ends.
pub struct MarkPlacer {
    plan: MarkPlan,
    frames_per_unit: f64,
    next: usize,
    last: f64,
}

impl MarkPlacer {
    pub fn new(plan: MarkPlan, rate: &SpeakingRate) -> Self {
        MarkPlacer {
            plan,
            frames_per_unit: rate.frames_per_unit(),
            next: 0,
            last: 0.0,
        }
    }

    /// The marks placed now that `frames` frames exist: `(id, frame)`.
    pub fn due(&mut self, frames: usize) -> Vec<(usize, f64)> {
        let predicted = self.plan.weight * self.frames_per_unit;
        self.take(|share| {
            let at = share * predicted;
            (at <= frames as f64).then_some(at)
        })
    }

    /// Whether every mark has been placed.
    pub fn is_done(&self) -> bool {
        self.next >= self.plan.marks.len()
    }

    /// Generation ended after `frames` frames: every mark left, at its share of that length.
    pub fn finish(&mut self, frames: usize) -> Vec<(usize, f64)> {
        self.take(|share| Some(share * frames as f64))
            .into_iter()
            .map(|(id, at)| (id, at.min(frames as f64)))
            .collect()
    }

    fn take(&mut self, mut place: impl FnMut(f64) -> Option<f64>) -> Vec<(usize, f64)> {
        let mut out = Vec::new();
        while let Some(&(id, share)) = self.plan.marks.get(self.next) {
            let Some(at) = place(share) else { break };
            self.last = self.last.max(at);
            out.push((id, self.last));
            self.next += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_the_time_it_takes_to_say_the_text() {
        let text = "Screen reader on.";
        let plan = MarkPlan::new(text, &[(0, 0), (1, 7), (2, 14), (3, 99)]);
        let shares: Vec<f64> = plan.marks.iter().map(|m| m.1).collect();
        assert_eq!(shares[0], 0.0);
        assert_eq!(shares[3], 1.0);
        assert!(shares.windows(2).all(|w| w[0] < w[1]), "{shares:?}");
        // "Screen " is 7 of 20 units (the stop weighs 4).
        assert!((shares[1] - 7.0 / 20.0).abs() < 1e-9, "{shares:?}");
        // A CJK character weighs a syllable.
        assert_eq!(speech_weight("你好"), 6.0);
        // Offsets inside a character are taken at its start.
        let plan = MarkPlan::new("你好", &[(0, 4)]);
        assert_eq!(plan.marks[0].1, 0.5);
    }

    #[test]
    fn marks_are_placed_as_generation_reaches_them_and_the_rest_at_the_end() {
        let rate = SpeakingRate::default();
        let plan = MarkPlan {
            marks: vec![(0, 0.0), (1, 0.25), (2, 0.5), (3, 1.0)],
            weight: 48.0, // predicted: 40 frames
        };
        let mut placer = MarkPlacer::new(plan, &rate);
        assert_eq!(placer.due(0), vec![(0, 0.0)]);
        assert_eq!(placer.due(9), vec![]);
        assert_eq!(placer.due(10), vec![(1, 10.0)]);
        // The generation ended early, at 16 frames: the mark at half is at 8 — never before one already
        // placed, never after the end.
        assert!(!placer.is_done());
        assert_eq!(placer.finish(16), vec![(2, 10.0), (3, 16.0)]);
        assert!(placer.is_done());
        assert_eq!(placer.finish(16), vec![]);
    }

    #[test]
    fn the_speaking_rate_learns_from_whole_generations() {
        let rate = SpeakingRate::default();
        for _ in 0..50 {
            rate.learn(100, 200.0);
        }
        assert!((rate.frames_per_unit() - 0.5).abs() < 1e-3);
        // A single letter moves it little; nothing learned from nothing.
        rate.learn(10, 1.0);
        assert!((rate.frames_per_unit() - 0.5).abs() < 0.2);
        rate.learn(0, 100.0);
        rate.learn(5, 0.0);
    }
}
