//! When to start playing an utterance so that, once it is heard, it is heard without a gap.
//!
//! A machine that synthesises faster than real time plays from the first chunk, as soon as it can. One that is
//! slower (real-time factor `r` > 1: `r` seconds of compute per second of audio) would play the first chunk,
//! then wait for the next: gaps. If the utterance will last `L` seconds, synthesis started at 0 and has
//! produced `(t - t0) / r` seconds of audio by time `t`; playback started at `P` needs `t - P` seconds of it.
//! Both grow linearly, so the need is hardest to meet when the last audio arrives, at `t0 + L r`: no gap iff
//! `P >= t0 + L (r - 1)`, that is once `L (1 - 1/r)` seconds of audio are held. Audio comes in chunks, each
//! there only when all of it is made, which adds a chunk's worth (`c / r`). That is the least added delay for
//! no gap, and [`hold_seconds`] returns it (with a margin on `r`).
//!
//! A steady rate is not the whole story just below real time: the first chunks are small (a frame, in two
//! halves, then a few frames) and each pays the decoder's fixed cost, so a machine at `r` = 0.85 overall
//! still falls behind during its first second or so, and the rule above holds nothing. So the player also
//! keeps, for utterances of a few lengths, the least hold that their own deliveries needed ([`least_hold`]
//! of each utterance's first 0.25, 0.5, … 16 s), and holds at least that much (with the margin) before an
//! utterance of that length. Faster than real time they are 0 and the first chunk still plays at once.
//!
//! `r`, those holds and the seconds of speech per byte of text are learnt from the utterances this machine has
//! spoken ([`Rates`]): compute time excludes the time synthesis waited for the sink, so a fast machine paced by
//! playback still measures its own speed. Until one utterance has been measured, `r` is what `weights =
//! "auto"`'s timed step predicted for the chosen format, if it ran; with neither, nothing is held.

use std::time::Duration;

/// Speech per byte of UTF-8 text before any is measured: about 14 characters a second in English, and a CJK
/// character (3 bytes) about a quarter second, both near 0.07 s per byte.
const DEFAULT_SECONDS_PER_BYTE: f64 = 0.07;

/// The real-time factor is taken this much higher than measured: a machine's speed varies (other programs,
/// clock scaling), and a gap costs more than a little more delay.
pub const RTF_MARGIN: f64 = 1.1;

/// An utterance shorter than this (audio seconds) teaches nothing reliable: prefill and chunking dominate.
const MIN_SAMPLE_SECONDS: f64 = 1.0;

/// Weight of the newest measurement in the running estimates.
const NEWEST_WEIGHT: f64 = 0.5;

/// At most this much audio is held before playing (memory: 60 s of 24 kHz f32 is 5.8 MB); an utterance that
/// would need more starts with this much and may pause later.
pub const MAX_HOLD_SECONDS: f64 = 60.0;

/// Lengths of utterance (audio seconds) for which the least hold their first seconds needed is kept.
pub const NEEDED_AT: [f64; 7] = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0];

/// Weight of a smaller measurement of a needed hold: a larger one is taken at once (a gap costs more than a
/// little delay), a smaller one only lowers it gradually.
const NEEDED_DECAY: f64 = 0.25;

/// What this machine's synthesis has shown: its real-time factor and how long text sounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    /// Seconds of compute per second of audio: measured, or predicted until an utterance is measured.
    pub rtf: Option<f64>,
    /// Seconds of speech per byte of text at rate 1.
    pub seconds_per_byte: f64,
    /// Whether the values come from an utterance (the first one replaces any prediction and the default).
    pub measured: bool,
    /// The least audio held before playing that the utterances so far needed for no gap in their first
    /// [`NEEDED_AT`] seconds.
    pub needed: [f64; NEEDED_AT.len()],
}

impl Default for Rates {
    fn default() -> Self {
        Rates {
            rtf: None,
            seconds_per_byte: DEFAULT_SECONDS_PER_BYTE,
            measured: false,
            needed: [0.0; NEEDED_AT.len()],
        }
    }
}

/// One spoken utterance, as measured by its playback.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// Audio produced, in seconds.
    pub audio: f64,
    /// Time synthesis ran, not counting waits for the sink.
    pub compute: Duration,
    /// Bytes of text it said, and the speaking rate they were said at.
    pub text_bytes: usize,
    pub rate: f64,
    /// When each piece of audio was delivered (compute time since the start, waits for the sink left out) and
    /// the seconds it holds.
    pub arrivals: Vec<(Duration, f64)>,
}

impl Rates {
    /// Nothing measured yet, the real-time factor predicted by `weights = "auto"`'s timed step if there is
    /// one (so that the first utterance after a start is planned too).
    pub fn predicted(rtf: Option<f64>) -> Self {
        Rates {
            rtf: rtf.filter(|r| r.is_finite() && *r > 0.0),
            ..Rates::default()
        }
    }

    /// The audio `text_bytes` of text should give at speaking rate `rate`, in seconds.
    pub fn expected_seconds(&self, text_bytes: usize, rate: f64) -> f64 {
        text_bytes as f64 * self.seconds_per_byte / rate.max(0.1)
    }

    /// Seconds of audio to hold before playing an utterance expected to last `expected` seconds, made in
    /// chunks of at most `chunk` seconds.
    /// chunks of at most `chunk` seconds: what the steady rate asks, and at least what utterances of that
    /// length needed here before (both with the margin).
    pub fn hold_seconds(&self, expected: f64, chunk: f64) -> f64 {
        let steady = self
            .rtf
            .map_or(0.0, |rtf| hold_seconds(expected, rtf * RTF_MARGIN, chunk));
        let needed = self.needed_for(expected) * RTF_MARGIN;
        steady.max(needed).min(MAX_HOLD_SECONDS)
    }

    /// The hold utterances of `expected` seconds needed: interpolated between the lengths kept, never less
    /// than a shorter length needed (a longer utterance begins like a shorter one).
    pub fn needed_for(&self, expected: f64) -> f64 {
        if !expected.is_finite() || expected <= 0.0 {
            return 0.0;
        }
        let mut needed = 0.0f64;
        for (i, &at) in NEEDED_AT.iter().enumerate() {
            if at <= expected {
                needed = needed.max(self.needed[i]);
            } else {
                // Between the last length reached and this one, linearly.
                let (below_at, below) = match i {
                    0 => (0.0, self.needed[0]),
                    _ => (NEEDED_AT[i - 1], self.needed[i - 1]),
                };
                let part = (expected - below_at) / (at - below_at);
                needed = needed.max(below + part * (self.needed[i] - below));
                break;
            }
        }
        needed
    }

    /// Learns from one utterance: its needed holds whatever its length, its speed only from long ones.
    pub fn learn(&mut self, sample: &Sample) {
        self.learn_needed(&sample.arrivals);
        if sample.audio < MIN_SAMPLE_SECONDS {
            return;
        }
        let rtf = sample.compute.as_secs_f64() / sample.audio;
        // The first measurement replaces the guesses; later ones are blended in.
        let first = !self.measured;
        self.measured = true;
        self.rtf = Some(match self.rtf {
            Some(old) if !first => blend(old, rtf),
            _ => rtf,
        });
        if sample.text_bytes > 0 {
            let per_byte = sample.audio * sample.rate / sample.text_bytes as f64;
            self.seconds_per_byte = if first {
                per_byte
            } else {
                blend(self.seconds_per_byte, per_byte)
            };
        }
    }
}

impl Rates {
    /// For each kept length the utterance reached, the least hold its deliveries up to there needed.
    fn learn_needed(&mut self, arrivals: &[(Duration, f64)]) {
        let total: f64 = arrivals.iter().map(|a| a.1).sum();
        for (i, &at) in NEEDED_AT.iter().enumerate() {
            if at > total + 1e-9 {
                break;
            }
            // The pieces that begin within the first `at` seconds of audio.
            let mut begins = 0.0;
            let count = arrivals
                .iter()
                .take_while(|a| {
                    let inside = begins < at - 1e-9;
                    begins += a.1;
                    inside
                })
                .count();
            let new = least_hold(&arrivals[..count]);
            let old = self.needed[i];
            self.needed[i] = if new >= old {
                new
            } else {
                old + NEEDED_DECAY * (new - old)
            };
        }
    }
}

fn blend(old: f64, new: f64) -> f64 {
    old + NEWEST_WEIGHT * (new - old)
}

/// Audio to hold before playing `expected` seconds produced at real-time factor `rtf` in chunks of at most
/// `chunk` seconds: `expected (1 - 1/rtf)`, plus `chunk / rtf` as a chunk's audio is there only once all of it
/// is made, when slower than real time; none otherwise; at most [`MAX_HOLD_SECONDS`].
pub fn hold_seconds(expected: f64, rtf: f64, chunk: f64) -> f64 {
    if rtf <= 1.0 || !expected.is_finite() || expected <= 0.0 {
        return 0.0;
    }
    (expected * (1.0 - 1.0 / rtf) + chunk.max(0.0) / rtf).min(MAX_HOLD_SECONDS)
}

/// The least audio a player of `arrivals` (when each piece arrived, and the seconds it holds) could hold before
/// starting so that nothing after is late: it can start only as a piece arrives, and must start no earlier than
/// `arrival - audio before it` for every piece. Played with [`replay`], that hold leaves no gap; 0 when the first
/// piece can play at once.
pub fn least_hold(arrivals: &[(Duration, f64)]) -> f64 {
    let mut before = 0.0;
    let mut earliest = f64::NEG_INFINITY;
    for &(at, seconds) in arrivals {
        earliest = earliest.max(at.as_secs_f64() - before);
        before += seconds;
    }
    // Nothing, if the first piece is late for nothing; else the audio up to the first piece that arrives at or
    // after that time (a player starts as the write that reaches its hold arrives).
    if arrivals
        .first()
        .is_none_or(|a| a.0.as_secs_f64() >= earliest - 1e-9)
    {
        return 0.0;
    }
    let mut held = 0.0;
    for &(at, seconds) in arrivals {
        held += seconds;
        if at.as_secs_f64() >= earliest - 1e-9 {
            break;
        }
    }
    held
}

/// A real-time player of `arrivals` (when each piece of audio arrived, and how many seconds it holds) that
/// starts once `hold` seconds have arrived (or everything has): when the first sound is heard, and the total
/// silence after it while waiting for audio. `kazeia bench` and the tests replay streams through it.
pub fn replay(arrivals: &[(Duration, f64)], hold: f64) -> (Duration, Duration) {
    let total: f64 = arrivals.iter().map(|a| a.1).sum();
    let mut held = 0.0;
    let mut start = None;
    for &(at, seconds) in arrivals {
        held += seconds;
        if held >= hold.min(total) - 1e-9 {
            start = Some(at);
            break;
        }
    }
    let Some(start) = start else {
        return (Duration::ZERO, Duration::ZERO);
    };
    let mut played_until = start;
    let mut silence = Duration::ZERO;
    for &(at, seconds) in arrivals {
        if at > played_until {
            silence += at - played_until;
            played_until = at;
        }
        played_until += Duration::from_secs_f64(seconds);
    }
    (start, silence)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream at real-time factor `rtf`: a first chunk of 2 frames after a prefill, then chunks of 8
    /// frames (80 ms each), `frames` in all.
    fn stream(rtf: f64, frames: usize) -> Vec<(Duration, f64)> {
        let frame = 0.08;
        let mut at = 0.3; // prefill
        let mut arrivals = Vec::new();
        let mut left = frames;
        let mut first = true;
        while left > 0 {
            let n = if first { 2 } else { 8 }.min(left);
            first = false;
            at += n as f64 * frame * rtf;
            arrivals.push((Duration::from_secs_f64(at), n as f64 * frame));
            left -= n;
        }
        arrivals
    }

    /// A stream as the daemon's decoder makes it: a prefill, the first frame in two halves, then chunks that
    /// grow by a frame every third chunk up to 8; each chunk costs `fixed` seconds plus `rtf` times its audio
    /// (a decoder's per-chunk cost makes the small first chunks slow even when the whole is fast).
    fn daemon_stream(rtf: f64, fixed: f64, seconds: f64) -> Vec<(Duration, f64)> {
        let frame = 0.08;
        let mut at = 0.2;
        let mut arrivals = Vec::new();
        for _ in 0..2 {
            at += fixed + rtf * frame / 2.0;
            arrivals.push((Duration::from_secs_f64(at), frame / 2.0));
        }
        let (mut made, mut chunk) = (frame, 0);
        while made < seconds - 1e-9 {
            let n = (2 + chunk / 3).min(8) as f64 * frame;
            let n = n.min(seconds - made);
            at += fixed + rtf * n;
            arrivals.push((Duration::from_secs_f64(at), n));
            made += n;
            chunk += 1;
        }
        arrivals
    }

    #[test]
    fn the_least_hold_leaves_no_gap_and_less_would() {
        for (rtf, fixed) in [
            (0.3, 0.01),
            (0.7, 0.05),
            (0.85, 0.03),
            (1.0, 0.0),
            (1.5, 0.02),
        ] {
            for seconds in [0.3, 2.0, 30.0] {
                let arrivals = daemon_stream(rtf, fixed, seconds);
                let hold = least_hold(&arrivals);
                let (start, silence) = replay(&arrivals, hold);
                assert_eq!(
                    silence,
                    Duration::ZERO,
                    "rtf {rtf} + {fixed} s a chunk, {seconds} s: a gap after holding {hold:.3} s"
                );
                if start > arrivals[0].0 {
                    // Starting one piece earlier gaps.
                    let starting = arrivals.iter().position(|a| a.0 == start).unwrap();
                    let (_, short) = replay(&arrivals, hold - arrivals[starting].1);
                    assert!(
                        short > Duration::ZERO,
                        "rtf {rtf}, {seconds} s: not the least"
                    );
                }
            }
        }
        assert_eq!(least_hold(&[]), 0.0);
    }

    #[test]
    fn just_below_real_time_the_first_chunks_are_held_for_and_a_fast_machine_holds_nothing() {
        // 0.85 overall with 30 ms a chunk: the steady rule holds nothing, and the first chunks gap.
        let slow = daemon_stream(0.7, 0.03, 10.0);
        let mut rates = Rates::default();
        let sample = |arrivals: &Vec<(Duration, f64)>| Sample {
            audio: arrivals.iter().map(|a| a.1).sum(),
            compute: arrivals.last().unwrap().0,
            text_bytes: 140,
            rate: 1.0,
            arrivals: arrivals.clone(),
        };
        rates.learn(&sample(&slow));
        let rtf = rates.rtf.unwrap();
        assert!(rtf * RTF_MARGIN < 1.0, "{rtf}: the steady rule would hold");
        assert!(replay(&slow, 0.0).1 > Duration::from_millis(20));
        for seconds in [0.3, 1.0, 2.0, 10.0, 30.0] {
            let arrivals = daemon_stream(0.7, 0.03, seconds);
            let hold = rates.hold_seconds(seconds, 0.64);
            let (start, silence) = replay(&arrivals, hold);
            assert_eq!(silence, Duration::ZERO, "{seconds} s: held {hold:.2} s");
            // Not much later than the least: the margin's share.
            let least = replay(&arrivals, least_hold(&arrivals)).0;
            assert!(
                start <= least + Duration::from_millis(250),
                "{seconds} s: started at {start:?}, could at {least:?}"
            );
        }
        // A short utterance is held for no more than a long one.
        assert!(rates.hold_seconds(0.3, 0.64) <= rates.hold_seconds(10.0, 0.64));

        // Faster than real time, every piece is in time: nothing is held, and the first chunk plays at once.
        let fast = daemon_stream(0.3, 0.01, 10.0);
        let mut rates = Rates::default();
        rates.learn(&sample(&fast));
        assert_eq!(rates.needed, [0.0; NEEDED_AT.len()]);
        assert_eq!(rates.hold_seconds(10.0, 0.64), 0.0);
    }

    #[test]
    fn a_larger_need_is_taken_at_once_and_a_smaller_one_lowers_it_gradually() {
        let mut rates = Rates::default();
        let with_need = |need: f64| Sample {
            // Everything arrives at once after the first 40 ms: `need` seconds needed.
            arrivals: vec![
                (Duration::ZERO, 0.04),
                (Duration::from_secs_f64(need), 20.0),
            ],
            ..Sample::default()
        };
        rates.learn(&with_need(0.5));
        assert!((rates.needed[NEEDED_AT.len() - 1] - 20.04).abs() < 1e-9);
        let before = rates.needed;
        rates.learn(&with_need(0.0));
        assert!(rates.needed[6] < before[6] && rates.needed[6] > 0.5 * before[6]);
    }

    #[test]
    fn the_hold_is_the_least_that_leaves_no_gap() {
        for rtf in [1.2, 1.5, 2.0, 3.0] {
            for frames in [25, 125, 375] {
                let arrivals = stream(rtf, frames);
                let expected = frames as f64 * 0.08;
                let hold = hold_seconds(expected, rtf, 0.64);
                let (_, silence) = replay(&arrivals, hold);
                assert!(
                    silence < Duration::from_millis(1),
                    "rtf {rtf}, {frames} frames: {silence:?} of gaps after holding {hold:.2} s"
                );
                // Tight: a tenth less held (and a chunk's worth less, as chunks arrive whole) gaps.
                let (_, short) = replay(&arrivals, hold * 0.9 - 0.64);
                assert!(
                    short > Duration::ZERO,
                    "rtf {rtf}, {frames} frames: holding less did not gap"
                );
            }
        }
    }

    #[test]
    fn a_machine_faster_than_real_time_holds_nothing_and_plays_the_first_chunk() {
        let arrivals = stream(0.5, 125);
        assert_eq!(hold_seconds(10.0, 0.5, 0.64), 0.0);
        let (first, silence) = replay(&arrivals, 0.0);
        assert_eq!(first, arrivals[0].0);
        // The first chunk (160 ms) is heard before the second (640 ms at RTF 0.5: 320 ms) arrives.
        assert!(silence > Duration::ZERO && silence < Duration::from_millis(200));
        let rates = Rates::default();
        assert_eq!(
            rates.hold_seconds(10.0, 0.64),
            0.0,
            "nothing measured: nothing held"
        );
    }

    #[test]
    fn a_predicted_speed_plans_the_first_utterance_and_the_first_measurement_replaces_it() {
        let mut rates = Rates::predicted(Some(2.0));
        assert!(rates.hold_seconds(10.0, 0.64) > 5.0);
        assert_eq!(Rates::predicted(Some(f64::NAN)), Rates::default());
        rates.learn(&Sample {
            audio: 10.0,
            compute: Duration::from_secs(8),
            text_bytes: 100,
            rate: 1.0,
            ..Sample::default()
        });
        assert_eq!(
            rates.rtf,
            Some(0.8),
            "replaced, not blended with the prediction"
        );
        assert_eq!(rates.hold_seconds(10.0, 0.64), 0.0);
    }

    #[test]
    fn rates_are_learnt_from_long_utterances_only() {
        let mut rates = Rates::default();
        rates.learn(&Sample {
            audio: 0.5,
            compute: Duration::from_secs(5),
            text_bytes: 3,
            rate: 1.0,
            ..Sample::default()
        });
        assert_eq!(rates, Rates::default());
        rates.learn(&Sample {
            audio: 10.0,
            compute: Duration::from_secs(15),
            text_bytes: 125,
            rate: 1.0,
            ..Sample::default()
        });
        assert_eq!(rates.rtf, Some(1.5));
        assert!(rates.measured);
        assert!((rates.seconds_per_byte - 0.08).abs() < 1e-12);
        rates.learn(&Sample {
            audio: 10.0,
            compute: Duration::from_secs(25),
            text_bytes: 100,
            rate: 1.0,
            ..Sample::default()
        });
        assert_eq!(rates.rtf, Some(2.0));
        assert!((rates.seconds_per_byte - 0.09).abs() < 1e-12);
        // Said at twice the speed, the same text lasts half as long.
        assert!(
            (rates.expected_seconds(100, 2.0) * 2.0 - rates.expected_seconds(100, 1.0)).abs()
                < 1e-12
        );
        let hold = rates.hold_seconds(30.0, 0.64);
        let rtf = 2.0 * RTF_MARGIN;
        assert!((hold - 30.0 * (1.0 - 1.0 / rtf) - 0.64 / rtf).abs() < 1e-9);
        assert_eq!(hold_seconds(1e6, 2.0, 0.64), MAX_HOLD_SECONDS);
    }
}
