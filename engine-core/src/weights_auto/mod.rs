//! `weights = "auto"`: the most precise storage of the talker's and code predictor's linear weights that keeps
//! this machine comfortably faster than real time, from a short timed step of the model that is kept beside the
//! weight cache (measured once per model and machine, not guessed from core counts).
//!
//! The rule ([`decide`]): the candidates, most precise first, are the checkpoint's own precision (BF16 for the
//! released models: lossless), q8_0 and q4_0. A candidate's predicted time per frame is the talker's and code
//! predictor's measured time per frame scaled by the weight bytes a frame reads in that format (the two stages
//! are memory-bound: [`crate::lm::FrameBytes`]), plus the codec decoder's measured time per frame (the same in
//! every format). The first candidate whose predicted real-time factor is at most [`COMFORT`] is chosen; when
//! none is, the fastest, with a warning that speech may stutter.
//!
//! The step is timed with the weights in q4_0 ([`MEASURED_IN`]): formats with more bytes per weight stream them
//! at least as well per byte (`kazeia bench`'s bandwidth shares), so scaling up from q4_0 errs towards the faster
//! format. The measurement is cached ([`store`]) under the model, the CPU, the stages' backends and threads and
//! this Kazeia's version, so later loads decide the same without measuring ([`store::MeasurementStore::load`]).
//! A kept measurement that did not pick the most precise format may have been taken while other programs were
//! busy: the next loads time again, up to [`SETTLING_TIMINGS`] steps in all, and keep each stage's fastest time
//! ([`Measurement::best_with`]), so one busy moment does not decide for good and a slow machine pays a bounded
//! number of extra steps.

mod load;
mod measure;
pub mod store;

pub use load::{choose, cpu_name, load_synthesizer, log, model_identity, AutoMachine};
pub use measure::{measure, Measurement, TIMED_FRAMES};

use kazeia_backend_abi::WeightFormat;

use crate::linear::WeightStorage;
use crate::lm::{BlockBytes, ModelConfig};

/// The largest share of a frame's audio time that the talker, code predictor and decoder may take together for
/// a format to count as keeping up comfortably: 64 ms of compute per 80 ms frame, the rest left for the
/// machine's other work and the noise of a shared CPU.
pub const COMFORT: f64 = 0.8;

/// The timed steps after which a kept measurement is trusted whatever it picks (see the module's
/// documentation).
pub const SETTLING_TIMINGS: u32 = 3;

/// The format the timed step runs in (see the module's documentation).
pub const MEASURED_IN: WeightFormat = WeightFormat::Q4_0;

/// `[model] weights` / `--weights`: a storage named by the user (always obeyed), or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightsSetting {
    Auto,
    Fixed(WeightStorage),
}

impl std::str::FromStr for WeightsSetting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(WeightsSetting::Auto);
        }
        s.parse()
            .map(|f| WeightsSetting::Fixed(WeightStorage::Convert(f)))
            .map_err(|_| {
                format!("unknown weight format `{s}` (expected auto, bf16, q8_0, q4_0, f16 or f32)")
            })
    }
}

impl std::fmt::Display for WeightsSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightsSetting::Auto => f.write_str("auto"),
            WeightsSetting::Fixed(storage) => storage.fmt(f),
        }
    }
}

/// One candidate format and what the rule predicts for it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    pub format: WeightFormat,
    /// The talker's and code predictor's weight bytes per frame in this format.
    pub bytes_per_frame: u64,
    /// Talker + code predictor + decoder time per frame over the frame's audio time.
    pub rtf: f64,
}

/// What `auto` chose and why.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoChoice {
    pub format: WeightFormat,
    /// Every candidate, most precise first.
    pub predictions: Vec<Prediction>,
    /// The chosen format's predicted real-time factor is within [`COMFORT`].
    pub keeps_up: bool,
    pub measurement: Measurement,
    /// Measured during this load (false: the cached measurement was used).
    pub fresh: bool,
}

impl AutoChoice {
    /// The storage to load.
    pub fn storage(&self) -> WeightStorage {
        WeightStorage::Convert(self.format)
    }

    /// Why, in one line (the log and `kazeia status`).
    pub fn reason(&self) -> String {
        let m = &self.measurement;
        let predicted = self
            .predictions
            .iter()
            .map(|p| format!("{} {:.2}", p.format, p.rtf))
            .collect::<Vec<_>>()
            .join(", ");
        let verdict = if self.keeps_up {
            format!("the most precise with RTF <= {COMFORT}")
        } else {
            format!("none has RTF <= {COMFORT}: the fastest; speech may stutter")
        };
        format!(
            "auto: {verdict}; predicted RTF {predicted}; measured {} talker+code predictor {:.1} ms and \
             decoder {:.1} ms per {:.0} ms frame ({}, {})",
            m.measured_in,
            m.lm_ms,
            m.decoder_ms,
            m.frame_ms,
            match (self.fresh, m.timings) {
                (true, 1) => format!("timed now in {:.0} ms", m.cost_ms),
                (true, n) => format!("the best of {n} steps, the last timed now in {:.0} ms", m.cost_ms),
                (false, 1) => "cached".to_owned(),
                (false, n) => format!("the best of {n} steps, cached"),
            },
            m.machine,
        )
    }
}

/// The weights in use, in words (the log, `kazeia status`): `q4_0 (auto: …)` with the choice's reason, or
/// `q8_0 (as configured)`.
pub fn describe(setting: WeightsSetting, choice: Option<&AutoChoice>) -> String {
    match (setting, choice) {
        (WeightsSetting::Auto, Some(c)) => format!("{} ({})", c.format, c.reason()),
        (setting, _) => format!("{setting} (as configured)"),
    }
}

/// The candidates for a model whose checkpoint stores its linear weights as `stored`, most precise first, with
/// the bytes one frame reads in each (as this CPU's kernels hold quantised blocks).
pub fn candidates(config: &ModelConfig, stored: WeightFormat) -> Vec<(WeightFormat, u64)> {
    let mut formats = vec![stored];
    for lossy in [WeightFormat::Q8_0, WeightFormat::Q4_0] {
        if !formats.contains(&lossy) {
            formats.push(lossy);
        }
    }
    formats
        .into_iter()
        .map(|format| {
            let b = config.frame_weight_bytes(format, BlockBytes::this_cpu());
            (format, b.talker + b.code_predictor)
        })
        .collect()
}

/// The rule (see the module's documentation): `candidates` most precise first, with their bytes per frame;
/// `measurement` taken in one of them.
pub fn decide(
    measurement: &Measurement,
    candidates: &[(WeightFormat, u64)],
    fresh: bool,
) -> AutoChoice {
    assert!(!candidates.is_empty(), "no candidate format");
    let measured_bytes = candidates
        .iter()
        .find(|(f, _)| *f == measurement.measured_in)
        .map(|&(_, b)| b)
        .expect("the measured format is a candidate") as f64;
    let predictions: Vec<Prediction> = candidates
        .iter()
        .map(|&(format, bytes)| {
            let lm_ms = measurement.lm_ms * bytes as f64 / measured_bytes;
            Prediction {
                format,
                bytes_per_frame: bytes,
                rtf: (lm_ms + measurement.decoder_ms) / measurement.frame_ms,
            }
        })
        .collect();
    let fitting = predictions.iter().find(|p| p.rtf <= COMFORT);
    let fastest = predictions
        .iter()
        .min_by(|a, b| a.rtf.total_cmp(&b.rtf))
        .expect("candidates");
    AutoChoice {
        format: fitting.unwrap_or(fastest).format,
        keeps_up: fitting.is_some(),
        predictions,
        measurement: measurement.clone(),
        fresh,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use WeightFormat::{BF16, Q4_0, Q8_0};

    /// Bytes per frame of the released 0.6B's shapes, roughly: bf16 3.6×, q8_0 1.9× q4_0's.
    pub(super) const FORMATS: [(WeightFormat, u64); 3] = [(BF16, 3600), (Q8_0, 1900), (Q4_0, 1000)];

    /// A measurement at q4_0: `lm_ms` for the LM, 20 ms for the decoder, per 80 ms frame.
    pub(super) fn at_q4(lm_ms: f64) -> Measurement {
        Measurement {
            measured_in: Q4_0,
            lm_ms,
            decoder_ms: 20.0,
            frame_ms: 80.0,
            frames: 4,
            cost_ms: 300.0,
            timings: 1,
            machine: "test".into(),
        }
    }

    fn choice(lm_ms: f64) -> (WeightFormat, bool) {
        let c = decide(&at_q4(lm_ms), &FORMATS, true);
        (c.format, c.keeps_up)
    }

    #[test]
    fn the_most_precise_format_within_the_comfort_share_is_chosen() {
        // bf16: (5 · 3.6 + 20) / 80 = 0.475.
        assert_eq!(choice(5.0), (BF16, true));
        // bf16 (12 · 3.6 + 20) / 80 = 0.79: still in.
        assert_eq!(choice(12.0), (BF16, true));
        // 13.0: bf16 0.835 out, q8_0 (24.7 + 20) / 80 = 0.56.
        assert_eq!(choice(13.0), (Q8_0, true));
        // 30: q8_0 (57 + 20) / 80 = 0.96 out, q4_0 0.625 in.
        assert_eq!(choice(30.0), (Q4_0, true));
        // 50: q4_0 (50 + 20) / 80 = 0.875: nothing keeps up, the fastest is taken.
        assert_eq!(choice(50.0), (Q4_0, false));
    }

    #[test]
    fn the_edges_of_the_comfort_share() {
        // Exactly 0.8 is in: q4_0 (44 + 20) / 80 = 0.8 (q8_0: 1.845).
        let at = decide(&at_q4(44.0), &FORMATS, true);
        assert_eq!((at.format, at.keeps_up), (Q4_0, true));
        assert!((at.predictions[2].rtf - COMFORT).abs() < 1e-12);
        // q8_0 exactly at 0.8 with bytes that keep the arithmetic exact: (22 · 2 + 20) / 80.
        let doubling = [(BF16, 4000), (Q8_0, 2000), (Q4_0, 1000)];
        let q8_edge = decide(&at_q4(22.0), &doubling, true);
        assert_eq!((q8_edge.format, q8_edge.keeps_up), (Q8_0, true));
        let past = decide(&at_q4(22.001), &doubling, true);
        assert_eq!((past.format, past.keeps_up), (Q4_0, true));
        // A decoder that alone takes more than the comfort share: no format keeps up.
        let mut slow = at_q4(1.0);
        slow.decoder_ms = 70.0;
        let c = decide(&slow, &FORMATS, true);
        assert_eq!((c.format, c.keeps_up), (Q4_0, false));
    }

    #[test]
    fn predictions_scale_the_measured_time_by_bytes() {
        let c = decide(&at_q4(10.0), &FORMATS, false);
        let rtf: Vec<f64> = c.predictions.iter().map(|p| p.rtf).collect();
        for (got, want) in rtf.iter().zip([(36.0 + 20.0) / 80.0, 0.4875, 0.375]) {
            assert!((got - want).abs() < 1e-12, "{rtf:?}");
        }
        assert!(c.reason().contains("cached"), "{}", c.reason());
        assert!(c.reason().contains("bf16 0.70"), "{}", c.reason());
    }

    #[test]
    fn a_setting_is_auto_or_a_format() {
        assert_eq!("auto".parse(), Ok(WeightsSetting::Auto));
        assert_eq!(
            "q8_0".parse(),
            Ok(WeightsSetting::Fixed(WeightStorage::Convert(Q8_0)))
        );
        assert!("q3".parse::<WeightsSetting>().is_err());
        assert_eq!(WeightsSetting::Auto.to_string(), "auto");
        assert_eq!(
            WeightsSetting::Fixed(WeightStorage::Convert(BF16)).to_string(),
            "bf16"
        );
    }
}
