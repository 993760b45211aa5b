//! The timed step behind `weights = "auto"`: a few frames of the loaded model, the talker and code predictor timed
//! apart from the codec decoder.

use std::time::Instant;

use kazeia_backend_abi::WeightFormat;

use crate::error::Result;
use crate::fallback::{Stage, Stages};
use crate::lm::generate::generate_on;
use crate::lm::PromptRequest;

/// Frames timed (after one untimed frame that touches every buffer and wakes the thread pools).
pub const TIMED_FRAMES: usize = 4;

/// What one frame costs on this machine, as measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Measurement {
    /// The format of the talker's and code predictor's weights during the step.
    pub measured_in: WeightFormat,
    /// Talker + code predictor per frame, in ms.
    pub lm_ms: f64,
    /// Codec decoder per frame, in ms.
    pub decoder_ms: f64,
    /// Audio per frame, in ms (80 for the released models).
    pub frame_ms: f64,
    /// Frames timed.
    pub frames: usize,
    /// The whole step's wall time, warm-up and prompt included, in ms (the latest step's).
    pub cost_ms: f64,
    /// Timed steps whose fastest times these are (1: a single step; see [`Measurement::best_with`]).
    pub timings: u32,
    /// The machine as keyed ([`super::AutoMachine::describe`]): CPU, backends and threads.
    pub machine: String,
}

/// Times [`TIMED_FRAMES`] frames of `request` (greedy, end of speech ignored) on `stages`, and their decoding,
/// after one untimed frame of each (the first touch of the buffers and thread pools). `measured_in`: the format
/// the model's weights are held in. A stage whose backend fails moves to the CPU as it would while speaking
/// ([`crate::fallback`]), so a failing plugin does not fail the load.
pub fn measure(
    stages: &dyn Stages,
    request: &PromptRequest,
    measured_in: WeightFormat,
    machine: String,
) -> Result<Measurement> {
    let start = Instant::now();
    let model = stages.model();
    let prompt = model.prompt(request)?;
    let mut options = model.default_options(true);
    options.ignore_eos = true;
    options.text_budget = false;
    // One untimed frame, then the timed ones, in one generation: each frame's end is stamped, so the timed
    // span runs from the first frame's end to the last's (one prefill in all). `max_new_tokens` N gives N − 1
    // frames (the official meaning).
    options.max_new_tokens = TIMED_FRAMES + 2;
    let mut ends = Vec::with_capacity(TIMED_FRAMES + 1);
    let generated = generate_on(stages, &prompt, &options, &mut || 0.5, &mut |_| {
        ends.push(Instant::now());
        true
    })?;
    let (Some(&first), Some(&last)) = (ends.first(), ends.last()) else {
        return Err(crate::Error::Input(
            "the timed step generated no frame".into(),
        ));
    };
    let frames = (ends.len() - 1).max(1);
    let lm = last - first;
    let (warm, timed) = generated.codes.split_at(1);
    decode(stages, warm)?;
    let decode_start = Instant::now();
    decode(stages, timed)?;
    let decoder = decode_start.elapsed();
    let per_frame = |d: std::time::Duration| whole_us(d.as_secs_f64() * 1e3 / frames as f64);
    let codec = stages.decoder();
    Ok(Measurement {
        measured_in,
        lm_ms: per_frame(lm),
        decoder_ms: per_frame(decoder),
        frame_ms: whole_us(codec.samples_per_frame() as f64 * 1e3 / codec.sample_rate() as f64),
        frames,
        cost_ms: whole_us(start.elapsed().as_secs_f64() * 1e3),
        timings: 1,
        machine,
    })
}

impl Measurement {
    /// This measurement and a later one of the same machine, as one: each stage's faster time (another
    /// program's load only ever slows a step, so the fastest seen is the machine's own speed), the later
    /// step's cost, and the steps counted.
    pub fn best_with(&self, later: &Measurement) -> Measurement {
        Measurement {
            lm_ms: self.lm_ms.min(later.lm_ms),
            decoder_ms: self.decoder_ms.min(later.decoder_ms),
            timings: self.timings + later.timings,
            ..later.clone()
        }
    }
}

/// `ms` rounded to whole microseconds: what a kept measurement holds ([`super::store`]).
fn whole_us(ms: f64) -> f64 {
    (ms * 1e3).round() / 1e3
}

/// Decodes `codes`, moving the decoder to the CPU once if its backend fails.
fn decode(stages: &dyn Stages, codes: &[Vec<u32>]) -> Result<Vec<f32>> {
    match stages.decoder().decode(codes) {
        Err(e) if stages.can_recover(Stage::Decoder) => {
            stages.recover(Stage::Decoder, e)?;
            stages.decoder().decode(codes)
        }
        other => other,
    }
}
