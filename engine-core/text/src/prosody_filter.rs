//! Rate, pitch and volume for synthesized speech: a streaming filter over mono f32 samples.
//!
//! The model has no prosody controls, so its audio is changed afterwards, in three stages:
//! - **rate**: WSOLA time-scale modification (Verhelst & Roelands, 1993). Hann frames of 30 ms are laid down
//!   every 15 ms of output; each is read from the input near its nominal time, at the offset (within ±10 ms)
//!   whose start best matches the natural continuation of the previous frame, so that pitch periods line up
//!   and the pitch is kept.
//! - **pitch**: a stretch by rate / pitch, then resampling by the pitch factor (Kaiser-windowed sinc), which
//!   moves every frequency by that factor and gives the duration back.
//! - **volume**: a gain, then a soft limiter that leaves |y| ≤ 0.9 untouched and never exceeds 1.
//!
//! Every decision depends only on sample values, and a stage acts as soon as the input it needs has arrived,
//! so the output is the same, bit for bit, whatever the chunking. The delay is bounded: the stretch needs
//! at most one frame plus the search tolerance ahead (40 ms of input), the resampler 1.5–3 ms more.
//! `finish` treats the input as followed by silence and cuts the output to input length / rate.

use std::f64::consts::PI;

pub const MIN_RATE: f32 = 0.25;
pub const MAX_RATE: f32 = 4.0;
pub const MIN_PITCH: f32 = 0.5;
pub const MAX_PITCH: f32 = 2.0;
pub const MAX_VOLUME: f32 = 4.0;

/// Output magnitudes up to here pass unchanged; above, they bend smoothly towards 1.
const LIMITER_KNEE: f32 = 0.9;

/// WSOLA frame length (twice the output hop) and how far from its nominal place a frame may be read.
const FRAME_SECONDS: f64 = 0.030;
const TOLERANCE_SECONDS: f64 = 0.010;
/// Frames are sized for at most this sample rate, so that an absurd rate cannot ask for gigabytes.
const MAX_SIZING_RATE: u32 = 384_000;

/// Resampling kernel: sinc zero crossings on each side, Kaiser β (≈ 80 dB stopband), and the cutoff as a
/// fraction of the lower of the two Nyquist frequencies.
const ZERO_CROSSINGS: usize = 32;
const KAISER_BETA: f64 = 8.0;
const CUTOFF: f64 = 0.9;

/// Rate, pitch and volume applied to a stream of samples; one utterance at a time (`finish` ends one and
/// leaves the filter ready for the next).
pub struct ProsodyFilter {
    rate: f32,
    pitch: f32,
    volume: f32,
    stretch: Option<Stretch>,
    resample: Option<Resample>,
    /// Stretched samples on their way to the resampler.
    between: Vec<f32>,
}

impl ProsodyFilter {
    /// `rate`: speed multiplier, clamped to 0.25..=4. `pitch`: frequency multiplier, clamped to 0.5..=2.
    /// `volume`: linear gain, clamped to 0..=4. A NaN rate or pitch means 1 (unchanged); a NaN volume
    /// means 0, as it comes of silence times an overflow (`0 × ∞`), and must not be heard. `sample_rate` only
    /// sizes the frames; one too small to be real makes them a few samples long, one above 384 kHz is sized
    /// as 384 kHz, so it cannot fail. With pitch ≠ 1, building takes up to a millisecond (the resampling
    /// bank): keep the filter across utterances with the same settings.
    pub fn new(sample_rate: u32, rate: f32, pitch: f32, volume: f32) -> Self {
        let rate = clamp_or_one(rate, MIN_RATE, MAX_RATE);
        let pitch = clamp_or_one(pitch, MIN_PITCH, MAX_PITCH);
        let volume = if volume.is_nan() {
            0.0
        } else {
            volume.clamp(0.0, MAX_VOLUME)
        };
        // Resampling by `pitch` shortens by `pitch`, so the stretch makes up the difference to `rate`.
        let stretch_ratio = rate as f64 / pitch as f64;
        ProsodyFilter {
            rate,
            pitch,
            volume,
            stretch: (stretch_ratio != 1.0).then(|| Stretch::new(sample_rate, stretch_ratio)),
            resample: (pitch != 1.0).then(|| Resample::new(pitch as f64)),
            between: Vec::new(),
        }
    }

    /// The speed multiplier in effect (after clamping).
    pub fn rate(&self) -> f32 {
        self.rate
    }

    /// The frequency multiplier in effect (after clamping).
    pub fn pitch(&self) -> f32 {
        self.pitch
    }

    /// The gain in effect (after clamping).
    pub fn volume(&self) -> f32 {
        self.volume
    }

    /// True when samples pass through unchanged and undelayed.
    pub fn is_identity(&self) -> bool {
        self.rate == 1.0 && self.pitch == 1.0 && self.volume == 1.0
    }

    /// Takes the next samples of the utterance (any count, including none) and appends to `out` every output
    /// sample they make final. NaN and infinite samples are taken as silence.
    pub fn process(&mut self, input: &[f32], out: &mut Vec<f32>) {
        if self.is_identity() {
            out.extend_from_slice(input);
            return;
        }
        let start = out.len();
        match (&mut self.stretch, &mut self.resample) {
            (None, None) => out.extend(input.iter().map(|&x| finite_or_zero(x))),
            (Some(stretch), None) => stretch.process(input, out),
            (None, Some(resample)) => resample.process(input, out),
            (Some(stretch), Some(resample)) => {
                self.between.clear();
                stretch.process(input, &mut self.between);
                resample.process(&self.between, out);
            }
        }
        self.apply_volume(&mut out[start..]);
    }

    /// Ends the utterance: appends what is still held (the input is taken as followed by silence), then
    /// resets for the next utterance.
    pub fn finish(&mut self, out: &mut Vec<f32>) {
        let start = out.len();
        match (&mut self.stretch, &mut self.resample) {
            (None, None) => return,
            (Some(stretch), None) => stretch.finish(out),
            (None, Some(resample)) => resample.finish(out),
            (Some(stretch), Some(resample)) => {
                self.between.clear();
                stretch.finish(&mut self.between);
                resample.process(&self.between, out);
                resample.finish(out);
            }
        }
        self.apply_volume(&mut out[start..]);
    }

    /// Drops what is held without output (the utterance was stopped).
    pub fn reset(&mut self) {
        if let Some(stretch) = &mut self.stretch {
            stretch.reset();
        }
        if let Some(resample) = &mut self.resample {
            resample.reset();
        }
    }

    fn apply_volume(&self, samples: &mut [f32]) {
        for sample in samples {
            *sample = soft_limit(*sample * self.volume);
        }
    }
}

fn clamp_or_one(value: f32, min: f32, max: f32) -> f32 {
    if value.is_nan() {
        1.0
    } else {
        value.clamp(min, max)
    }
}

fn finite_or_zero(x: f32) -> f32 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

/// Identity up to the knee; above it a tanh curve with slope 1 at the knee, approaching 1.
fn soft_limit(y: f32) -> f32 {
    let magnitude = y.abs();
    if magnitude <= LIMITER_KNEE {
        return y;
    }
    let room = 1.0 - LIMITER_KNEE;
    (LIMITER_KNEE + room * ((magnitude - LIMITER_KNEE) / room).tanh()).copysign(y)
}

/// Input samples from an absolute index on, read past their end as silence once the stream has ended.
struct History {
    samples: Vec<f32>,
    /// Absolute index of `samples[0]`.
    start: usize,
    /// Real samples received (padding excluded).
    received: usize,
}

impl History {
    fn new() -> Self {
        History {
            samples: Vec::new(),
            start: 0,
            received: 0,
        }
    }

    fn push(&mut self, input: &[f32]) {
        self.samples
            .extend(input.iter().map(|&x| finite_or_zero(x)));
        self.received += input.len();
    }

    /// Samples `from..from + len` (absolute); they must be held.
    fn slice(&self, from: usize, len: usize) -> &[f32] {
        &self.samples[from - self.start..from - self.start + len]
    }

    /// Appends silence so that absolute index `end - 1` is held (after the end of the stream).
    fn pad_to(&mut self, end: usize) {
        let held_end = self.start + self.samples.len();
        if held_end < end {
            self.samples.resize(end - self.start, 0.0);
        }
    }

    /// Forgets samples before absolute index `keep` (one move per call, not per frame, so that a long
    /// one-shot input stays linear in time).
    fn forget_before(&mut self, keep: usize) {
        let drop = keep.saturating_sub(self.start).min(self.samples.len());
        self.samples.drain(..drop);
        self.start += drop;
    }

    fn reset(&mut self) {
        *self = History::new();
    }
}

/// WSOLA time stretch: output frame k (Hann, `2 * hop` long) starts at output sample `k * hop` and is read
/// from input position `round(k * hop * ratio) + δ`, |δ| ≤ tolerance. Output below `(k + 1) * hop` is final
/// once frame k is added.
struct Stretch {
    /// Input advanced per output sample (the speed-up).
    ratio: f64,
    hop: usize,
    tolerance: usize,
    window: Vec<f32>,
    input: History,
    /// Index of the next frame to place.
    frame: usize,
    /// Input position of the last frame placed.
    prev_pos: usize,
    /// Second half of the last frame placed, windowed: output `frame * hop..(frame + 1) * hop` so far.
    tail: Vec<f32>,
    emitted: usize,
}

impl Stretch {
    fn new(sample_rate: u32, ratio: f64) -> Self {
        let sample_rate = sample_rate.min(MAX_SIZING_RATE);
        let hop = ((sample_rate as f64 * FRAME_SECONDS / 2.0).round() as usize).max(8);
        let tolerance = ((sample_rate as f64 * TOLERANCE_SECONDS).round() as usize).max(4);
        let len = 2 * hop;
        // Periodic Hann: the falling half of one frame and the rising half of the next sum to 1.
        let window = (0..len)
            .map(|i| (0.5 - 0.5 * (2.0 * PI * i as f64 / len as f64).cos()) as f32)
            .collect();
        Stretch {
            ratio,
            hop,
            tolerance,
            window,
            input: History::new(),
            frame: 0,
            prev_pos: 0,
            tail: vec![0.0; hop],
            emitted: 0,
        }
    }

    fn process(&mut self, input: &[f32], out: &mut Vec<f32>) {
        self.input.push(input);
        self.place_frames(false, out);
        let keep = if self.frame == 0 {
            0
        } else {
            let (lo, _) = self.search_range();
            lo.min(self.prev_pos + self.hop)
        };
        self.input.forget_before(keep);
    }

    fn finish(&mut self, out: &mut Vec<f32>) {
        self.place_frames(true, out);
        self.reset();
    }

    fn reset(&mut self) {
        self.input.reset();
        self.frame = 0;
        self.prev_pos = 0;
        self.tail.fill(0.0);
        self.emitted = 0;
    }

    fn center(&self) -> usize {
        (self.frame as f64 * self.hop as f64 * self.ratio).round() as usize
    }

    /// First and last candidate input positions of the next frame.
    fn search_range(&self) -> (usize, usize) {
        let center = self.center();
        (
            center.saturating_sub(self.tolerance),
            center + self.tolerance,
        )
    }

    /// Places frames while their input is there; at the end, until the output reaches input / ratio.
    fn place_frames(&mut self, at_end: bool, out: &mut Vec<f32>) {
        let target = at_end.then(|| (self.input.received as f64 / self.ratio).round() as usize);
        let len = 2 * self.hop;
        loop {
            let room = match target {
                Some(target) => target.saturating_sub(self.emitted).min(self.hop),
                None => self.hop,
            };
            if room == 0 {
                return;
            }
            let need = if self.frame == 0 {
                len
            } else {
                let (_, hi) = self.search_range();
                (hi + len).max(self.prev_pos + len)
            };
            if self.input.received < need {
                if !at_end {
                    return;
                }
                self.input.pad_to(need);
            }
            let pos = if self.frame == 0 {
                0
            } else {
                self.best_position()
            };
            self.add_frame(pos, room, out);
        }
    }

    /// The candidate whose first `hop` samples best match (normalised cross-correlation) the `hop` samples
    /// that follow the previous frame's first half in the input; ties go to the one nearest the nominal
    /// place, so silence is read in order.
    fn best_position(&self) -> usize {
        let hop = self.hop;
        let (lo, hi) = self.search_range();
        let center = self.center();
        let template = self.input.slice(self.prev_pos + hop, hop);
        let candidates = self.input.slice(lo, hi - lo + hop);
        let square = |x: f32| x as f64 * x as f64;
        let mut energy: f64 = candidates[..hop].iter().map(|&x| square(x)).sum();
        let mut best = (f64::NEG_INFINITY, usize::MAX, center);
        for (i, pos) in (lo..=hi).enumerate() {
            if i > 0 {
                energy += square(candidates[i + hop - 1]) - square(candidates[i - 1]);
            }
            let correlation = dot(template, &candidates[i..i + hop]) as f64;
            let score = correlation / (energy.max(0.0) + 1e-12).sqrt();
            let distance = pos.abs_diff(center);
            if score > best.0 || (score == best.0 && distance < best.1) {
                best = (score, distance, pos);
            }
        }
        best.2
    }

    /// Adds the frame read at `pos` and emits the first `emit` (≤ hop) samples it completes.
    fn add_frame(&mut self, pos: usize, emit: usize, out: &mut Vec<f32>) {
        let hop = self.hop;
        let segment = self.input.slice(pos, 2 * hop);
        if self.frame == 0 {
            // An imagined frame before it would have been its natural continuation: the start is the input.
            out.extend_from_slice(&segment[..emit]);
        } else {
            let (tail, window) = (&self.tail, &self.window);
            out.extend((0..emit).map(|i| tail[i] + window[i] * segment[i]));
        }
        for i in 0..hop {
            self.tail[i] = self.window[hop + i] * segment[hop + i];
        }
        self.emitted += emit;
        self.prev_pos = pos;
        self.frame += 1;
    }
}

/// Dot product with eight running sums in a fixed order (vectorisable, and the same result wherever the
/// slices sit in memory).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut sums = [0f32; 8];
    let chunks = a.chunks_exact(8).zip(b.chunks_exact(8));
    for (x, y) in chunks {
        for lane in 0..8 {
            sums[lane] += x[lane] * y[lane];
        }
    }
    let full = a.len() / 8 * 8;
    let rest: f32 = a[full..].iter().zip(&b[full..]).map(|(x, y)| x * y).sum();
    sums.iter().sum::<f32>() + rest
}

/// Band-limited resampling that reads the input `step` times as fast: output n is the input interpolated
/// at `n * step`, low-passed below the lower Nyquist frequency when `step` > 1. A polyphase bank: the
/// kernel's taps for `PHASES + 1` evenly spaced fractional positions, interpolated linearly between two.
struct Resample {
    step: f64,
    /// Taps on each side of the interpolated position.
    half: usize,
    /// `bank[p * 2 * half..][..2 * half]`: the taps for fractional position p / PHASES.
    bank: Vec<f32>,
    /// Sum of each phase's taps, to make the DC gain exactly 1.
    sums: Vec<f32>,
    /// Input preceded by `half` samples of silence, so that the kernel can reach before the start.
    input: History,
    next: u64,
}

/// Fractional positions in the resampling bank.
const PHASES: usize = 128;

impl Resample {
    fn new(step: f64) -> Self {
        // The kernel's zero crossings are 1 / scale input samples apart.
        let scale = CUTOFF * (1.0 / step).min(1.0);
        let half = (ZERO_CROSSINGS as f64 / scale).ceil() as usize;
        let taps = 2 * half;
        let norm = bessel_i0(KAISER_BETA);
        let mut bank = Vec::with_capacity((PHASES + 1) * taps);
        for p in 0..=PHASES {
            for i in 0..taps {
                // Tap i reads input floor(t) - half + 1 + i, at distance frac + half - 1 - i from t.
                let distance = p as f64 / PHASES as f64 + half as f64 - 1.0 - i as f64;
                bank.push(kaiser_sinc(distance * scale, norm) as f32);
            }
        }
        let sums = bank
            .chunks_exact(taps)
            .map(|taps| taps.iter().sum())
            .collect();
        let mut resample = Resample {
            step,
            half,
            bank,
            sums,
            input: History::new(),
            next: 0,
        };
        resample.reset();
        resample
    }

    fn process(&mut self, input: &[f32], out: &mut Vec<f32>) {
        self.input.push(input);
        self.produce(false, out);
        let t = self.next as f64 * self.step;
        self.input.forget_before(t.floor() as usize + 1);
    }

    fn finish(&mut self, out: &mut Vec<f32>) {
        self.produce(true, out);
        self.reset();
    }

    fn reset(&mut self) {
        self.input.reset();
        self.input.push(&vec![0.0; self.half]);
        self.next = 0;
    }

    /// Emits outputs while their taps have arrived; at the end, every output before the input's end.
    fn produce(&mut self, at_end: bool, out: &mut Vec<f32>) {
        let taps = 2 * self.half;
        let received = self.input.received - self.half;
        let total = at_end.then(|| (received as f64 / self.step).ceil() as u64);
        loop {
            if total.is_some_and(|total| self.next >= total) {
                return;
            }
            let t = self.next as f64 * self.step;
            let whole = t.floor();
            // With the leading silence, tap 0 (input floor(t) - half + 1) sits at floor(t) + 1.
            let first = whole as usize + 1;
            if self.input.received < first + taps {
                if !at_end {
                    return;
                }
                self.input.pad_to(first + taps);
            }
            let x = self.input.slice(first, taps);
            let position = (t - whole) * PHASES as f64;
            let phase = (position as usize).min(PHASES - 1);
            let frac = (position - phase as f64) as f32;
            let below = dot(&self.bank[phase * taps..][..taps], x);
            let above = dot(&self.bank[(phase + 1) * taps..][..taps], x);
            let weight = (1.0 - frac) * self.sums[phase] + frac * self.sums[phase + 1];
            out.push(((1.0 - frac) * below + frac * above) / weight);
            self.next += 1;
        }
    }
}

/// sinc(u) · Kaiser window over |u| < ZERO_CROSSINGS; `norm` is I0(β).
fn kaiser_sinc(u: f64, norm: f64) -> f64 {
    let r = u / ZERO_CROSSINGS as f64;
    if r.abs() >= 1.0 {
        return 0.0;
    }
    let sinc = if u == 0.0 {
        1.0
    } else {
        (PI * u).sin() / (PI * u)
    };
    sinc * bessel_i0(KAISER_BETA * (1.0 - r * r).sqrt()) / norm
}

/// Modified Bessel function of the first kind, order 0 (power series; converges fast for the β used).
fn bessel_i0(x: f64) -> f64 {
    let mut sum = 1.0;
    let mut term = 1.0;
    let half = x / 2.0;
    for k in 1..100 {
        term *= (half / k as f64) * (half / k as f64);
        sum += term;
        if term < 1e-17 * sum {
            break;
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streaming memory stays bounded: after each chunk, the stretch holds at most one frame, the search
    /// span and one analysis hop; the resampler less than its taps — whatever the chunk size.
    #[test]
    fn held_input_is_bounded() {
        let sample_rate = 24_000;
        for (rate, pitch) in [(0.25, 2.0), (4.0, 0.5), (2.0, 1.0), (1.0, 1.5)] {
            for chunk in [1, 1920, 48_000] {
                let mut filter = ProsodyFilter::new(sample_rate, rate, pitch, 1.0);
                let mut out = Vec::new();
                let mut phase = 0.0f32;
                let seconds = if chunk == 1 { 3 } else { 60 };
                for _ in 0..(sample_rate as usize * seconds / chunk) {
                    let input: Vec<f32> = (0..chunk)
                        .map(|_| {
                            phase += 0.037;
                            0.5 * phase.sin()
                        })
                        .collect();
                    filter.process(&input, &mut out);
                    if let Some(stretch) = &filter.stretch {
                        let analysis_hop = (stretch.hop as f64 * stretch.ratio).ceil() as usize;
                        let bound = 2 * stretch.hop + 4 * stretch.tolerance + analysis_hop;
                        let held = stretch.input.samples.len();
                        assert!(
                            held <= bound,
                            "rate {rate} pitch {pitch}, chunks of {chunk}: {held} held"
                        );
                    }
                    if let Some(resample) = &filter.resample {
                        let held = resample.input.samples.len();
                        assert!(
                            held < 2 * resample.half,
                            "rate {rate} pitch {pitch}: {held} held"
                        );
                    }
                }
            }
        }
    }
}
