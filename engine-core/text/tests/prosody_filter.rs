//! The rate / pitch / volume filter on synthetic signals whose right answer is known: sines, a voiced signal
//! (pulse train through a formant resonator), a speech-like mix with gliding pitch, noise and a pause.

use std::time::Instant;

use kazeia_text::prosody_filter::ProsodyFilter;

const SR: u32 = 24_000;

/// xorshift64*: reproducible noise and chunk sizes without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Uniform in [-1, 1).
    fn signed(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn samples(seconds: f64, sample_rate: u32) -> usize {
    (seconds * sample_rate as f64).round() as usize
}

fn sine(freq: f64, amplitude: f32, seconds: f64, sample_rate: u32) -> Vec<f32> {
    (0..samples(seconds, sample_rate))
        .map(|n| {
            amplitude
                * (2.0 * std::f64::consts::PI * freq * n as f64 / sample_rate as f64).sin() as f32
        })
        .collect()
}

/// Two-pole resonator (a formant) at `freq` Hz with bandwidth `bandwidth` Hz, applied in place.
fn resonate(x: &mut [f32], freq: f64, bandwidth: f64, sample_rate: u32) {
    let r = (-std::f64::consts::PI * bandwidth / sample_rate as f64).exp();
    let a1 = 2.0 * r * (2.0 * std::f64::consts::PI * freq / sample_rate as f64).cos();
    let a2 = -r * r;
    let (mut y1, mut y2) = (0.0f64, 0.0f64);
    for v in x.iter_mut() {
        let y = *v as f64 + a1 * y1 + a2 * y2;
        y2 = y1;
        y1 = y;
        *v = y as f32;
    }
}

fn normalize(x: &mut [f32], peak: f32) {
    let max = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    for v in x.iter_mut() {
        *v *= peak / max;
    }
}

/// A pulse each time the phase of `f0(t)` wraps, through a resonator at 800 Hz: a glottal source and one
/// formant, peak 0.5.
fn voiced_with(f0: impl Fn(f64) -> f64, seconds: f64, sample_rate: u32) -> Vec<f32> {
    let mut phase = 0.0;
    let mut x: Vec<f32> = (0..samples(seconds, sample_rate))
        .map(|n| {
            phase += f0(n as f64 / sample_rate as f64) / sample_rate as f64;
            if phase >= 1.0 {
                phase -= 1.0;
                1.0
            } else {
                0.0
            }
        })
        .collect();
    resonate(&mut x, 800.0, 150.0, sample_rate);
    normalize(&mut x, 0.5);
    x
}

fn voiced(f0: f64, seconds: f64) -> Vec<f32> {
    voiced_with(|_| f0, seconds, SR)
}

/// Gliding pitch (100–180 Hz), a noise burst like a fricative, a pause of silence, then voice again.
fn speech_like(seconds: f64) -> Vec<f32> {
    let mut x = voiced_with(
        |t| 140.0 + 40.0 * (2.0 * std::f64::consts::PI * 1.3 * t).sin(),
        seconds,
        SR,
    );
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let len = x.len();
    for v in &mut x[len * 3 / 10..len * 4 / 10] {
        *v = 0.2 * rng.signed();
    }
    for v in &mut x[len / 2..len / 2 + samples(0.1, SR)] {
        *v = 0.0;
    }
    x
}

fn one_shot(rate: f32, pitch: f32, volume: f32, input: &[f32]) -> Vec<f32> {
    let mut filter = ProsodyFilter::new(SR, rate, pitch, volume);
    let mut out = Vec::new();
    filter.process(input, &mut out);
    filter.finish(&mut out);
    out
}

fn chunked(filter: &mut ProsodyFilter, input: &[f32], mut size: impl FnMut() -> usize) -> Vec<f32> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < input.len() {
        let end = (at + size()).min(input.len());
        filter.process(&input[at..end], &mut out);
        at = end;
    }
    filter.finish(&mut out);
    out
}

/// The middle 60 %, away from the start and the padded end.
fn interior(x: &[f32]) -> &[f32] {
    &x[x.len() / 5..x.len() * 4 / 5]
}

/// Frequency from the rising zero crossings, located between samples by linear interpolation.
fn zero_crossing_frequency(x: &[f32], sample_rate: u32) -> f64 {
    let mut crossings = Vec::new();
    for i in 1..x.len() {
        if x[i - 1] < 0.0 && x[i] >= 0.0 {
            let frac = x[i - 1] as f64 / (x[i - 1] as f64 - x[i] as f64);
            crossings.push((i - 1) as f64 + frac);
        }
    }
    assert!(crossings.len() > 10, "too few zero crossings to measure");
    let span = crossings[crossings.len() - 1] - crossings[0];
    (crossings.len() - 1) as f64 / span * sample_rate as f64
}

/// Fundamental frequency (50–500 Hz) from the normalised autocorrelation: the first local peak within 90 %
/// of the highest, refined by a parabola.
fn autocorrelation_f0(x: &[f32], sample_rate: u32) -> f64 {
    let min_lag = (sample_rate / 500) as usize;
    let max_lag = (sample_rate / 50) as usize + 1;
    let n = x.len() - max_lag;
    assert!(n > 2 * max_lag, "signal too short to measure its pitch");
    let energy = |from: usize| {
        x[from..from + n]
            .iter()
            .map(|&v| v as f64 * v as f64)
            .sum::<f64>()
    };
    let e0 = energy(0);
    let r: Vec<f64> = (0..=max_lag)
        .map(|lag| {
            let c: f64 = (0..n).map(|i| x[i] as f64 * x[i + lag] as f64).sum();
            c / (e0 * energy(lag)).sqrt().max(1e-30)
        })
        .collect();
    let highest = r[min_lag..max_lag].iter().cloned().fold(f64::MIN, f64::max);
    let lag = (min_lag..max_lag)
        .find(|&l| r[l] >= 0.9 * highest && r[l] >= r[l - 1] && r[l] >= r[l + 1])
        .expect("a peak");
    let (a, b, c) = (r[lag - 1], r[lag], r[lag + 1]);
    let shift = 0.5 * (a - c) / (a - 2.0 * b + c);
    sample_rate as f64 / (lag as f64 + shift)
}

fn max_step(x: &[f32]) -> f32 {
    x.windows(2).fold(0.0, |m, w| m.max((w[1] - w[0]).abs()))
}

/// What `measure` (a frequency estimator) finds in the interior of `input` filtered at `(rate, pitch)`.
fn measured_after(
    (rate, pitch): (f32, f32),
    input: &[f32],
    measure: fn(&[f32], u32) -> f64,
) -> f64 {
    let out = one_shot(rate, pitch, 1.0, input);
    measure(interior(&out), SR)
}

fn assert_within(measured: f64, expected: f64, tolerance: f64, what: &str) {
    let error = (measured / expected - 1.0).abs();
    assert!(
        error <= tolerance,
        "{what}: measured {measured:.3}, expected {expected:.3} (error {:.3} % > {:.1} %)",
        error * 100.0,
        tolerance * 100.0
    );
}

#[test]
fn identity_passes_samples_through_bit_exactly_without_delay() {
    let mut filter = ProsodyFilter::new(SR, 1.0, 1.0, 1.0);
    assert!(filter.is_identity());
    let mut input = speech_like(0.3);
    input[10] = f32::NAN;
    input[11] = -0.0;
    input[12] = 3.5;
    let mut out = Vec::new();
    for chunk in input.chunks(333) {
        let before = out.len();
        filter.process(chunk, &mut out);
        assert_eq!(out.len() - before, chunk.len(), "identity must not delay");
    }
    filter.finish(&mut out);
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&out), bits(&input));
    assert!(!ProsodyFilter::new(SR, 1.0, 1.0, 1.01).is_identity());
    assert!(!ProsodyFilter::new(SR, 1.0, 0.99, 1.0).is_identity());
    assert!(!ProsodyFilter::new(SR, 1.2, 1.0, 1.0).is_identity());
}

/// Gives the size of each next chunk.
type ChunkSizes = Box<dyn FnMut() -> usize>;

#[test]
fn same_output_whatever_the_chunking() {
    let input = speech_like(1.2);
    let settings = [
        (1.5, 1.0, 1.0),
        (0.5, 1.0, 1.0),
        (2.0, 1.0, 1.0),
        (3.0, 1.0, 1.0),
        (1.0, 1.3, 1.0),
        (1.0, 0.7, 1.0),
        (2.0, 1.5, 0.8),
        (0.25, 2.0, 1.0),
        (4.0, 0.5, 3.0),
        (1.0, 1.0, 2.5),
        (1.3, 1.3, 1.0),
    ];
    for (rate, pitch, volume) in settings {
        let reference = one_shot(rate, pitch, volume, &input);
        let mut rng = Rng(12345);
        let sizes: [(&str, ChunkSizes); 5] = [
            ("1", Box::new(|| 1)),
            ("7", Box::new(|| 7)),
            ("480", Box::new(|| 480)),
            ("1920", Box::new(|| 1920)),
            ("random", Box::new(move || rng.below(3000))),
        ];
        for (name, size) in sizes {
            let mut filter = ProsodyFilter::new(SR, rate, pitch, volume);
            let out = chunked(&mut filter, &input, size);
            assert_eq!(
                out.len(),
                reference.len(),
                "rate {rate} pitch {pitch} volume {volume}, chunks of {name}: length"
            );
            if let Some(i) = (0..out.len()).find(|&i| out[i].to_bits() != reference[i].to_bits()) {
                panic!(
                    "rate {rate} pitch {pitch} volume {volume}, chunks of {name}: sample {i} is {} one-shot, {} chunked",
                    reference[i], out[i]
                );
            }
        }
    }
}

#[test]
fn output_length_is_input_length_over_rate() {
    let input = voiced(120.0, 3.0);
    let window = samples(0.030, SR) as f64;
    for (rate, pitch) in [
        (0.5, 1.0),
        (1.5, 1.0),
        (2.0, 1.0),
        (3.0, 1.0),
        (0.25, 1.0),
        (4.0, 1.0),
        (1.0, 0.5),
        (1.0, 2.0),
        (2.0, 1.5),
        (3.0, 0.8),
    ] {
        let out = one_shot(rate, pitch, 1.0, &input);
        let expected = input.len() as f64 / rate as f64;
        let error = (out.len() as f64 - expected).abs();
        assert!(
            error <= 0.01 * expected + window,
            "rate {rate} pitch {pitch}: {} samples out, expected {expected}",
            out.len()
        );
    }
}

#[test]
fn rate_keeps_the_frequency_of_a_sine() {
    let input = sine(200.0, 0.5, 2.0, SR);
    for rate in [0.5, 1.5, 2.0, 3.0, 0.25, 4.0] {
        let freq = measured_after((rate, 1.0), &input, zero_crossing_frequency);
        assert_within(freq, 200.0, 0.02, &format!("sine at rate {rate}"));
    }
}

#[test]
fn rate_keeps_the_pitch_of_a_voiced_signal() {
    let input = voiced(120.0, 3.0);
    assert_within(
        autocorrelation_f0(interior(&input), SR),
        120.0,
        0.02,
        "input",
    );
    for rate in [0.5, 1.5, 2.0, 3.0, 0.25, 4.0] {
        let f0 = measured_after((rate, 1.0), &input, autocorrelation_f0);
        assert_within(f0, 120.0, 0.02, &format!("voiced at rate {rate}"));
    }
}

#[test]
fn pitch_moves_frequencies_by_its_factor() {
    let tone = sine(200.0, 0.5, 2.0, SR);
    let voice = voiced(120.0, 3.0);
    for (rate, pitch) in [
        (1.0f32, 0.5f32),
        (1.0, 0.8),
        (1.0, 1.25),
        (1.0, 2.0),
        (2.0, 1.5),
        (0.5, 0.7),
        (3.0, 3.0),
    ] {
        let pitch_now = pitch.min(2.0);
        let freq = measured_after((rate, pitch), &tone, zero_crossing_frequency);
        assert_within(
            freq,
            200.0 * pitch_now as f64,
            0.02,
            &format!("sine at rate {rate} pitch {pitch}"),
        );
        let f0 = measured_after((rate, pitch), &voice, autocorrelation_f0);
        assert_within(
            f0,
            120.0 * pitch_now as f64,
            0.02,
            &format!("voiced at rate {rate} pitch {pitch}"),
        );
    }
}

/// Least-squares fit of a sinusoid of known frequency: its amplitude, and the RMS of everything else.
fn sine_fit(x: &[f32], freq: f64, sample_rate: u32) -> (f64, f64) {
    let w = 2.0 * std::f64::consts::PI * freq / sample_rate as f64;
    let (mut cc, mut ss, mut cs, mut xc, mut xs) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for (n, &v) in x.iter().enumerate() {
        let (s, c) = (w * n as f64).sin_cos();
        cc += c * c;
        ss += s * s;
        cs += c * s;
        xc += v as f64 * c;
        xs += v as f64 * s;
    }
    let det = cc * ss - cs * cs;
    let a = (xc * ss - xs * cs) / det;
    let b = (xs * cc - xc * cs) / det;
    let residual = x
        .iter()
        .enumerate()
        .map(|(n, &v)| {
            let (s, c) = (w * n as f64).sin_cos();
            (v as f64 - a * c - b * s).powi(2)
        })
        .sum::<f64>();
    ((a * a + b * b).sqrt(), (residual / x.len() as f64).sqrt())
}

#[test]
fn pitch_resampling_neither_aliases_nor_images() {
    let amplitude = 0.5;
    // In the passband: the tone moves, keeps its amplitude, and nothing else appears (an image of the
    // 9 kHz tone read at half speed would sit at 7.5 kHz, an alias of a poor low-pass anywhere).
    for (freq, pitch) in [(3000.0, 2.0), (9000.0, 0.5), (1000.0, 1.37), (5000.0, 0.8)] {
        let out = one_shot(1.0, pitch, 1.0, &sine(freq, amplitude, 1.0, SR));
        let (found, rest) = sine_fit(interior(&out), freq * pitch as f64, SR);
        assert!(
            (found / amplitude as f64 - 1.0).abs() < 0.01,
            "{freq} Hz at pitch {pitch}: amplitude {found}, not {amplitude}"
        );
        let db = 20.0 * (rest / amplitude as f64).log10();
        assert!(
            db < -60.0,
            "{freq} Hz at pitch {pitch}: other content at {db:.1} dB"
        );
    }
    // Above the new Nyquist: 8 kHz doubled would fold back to 8 kHz; it must be filtered out instead.
    let out = one_shot(1.0, 2.0, 1.0, &sine(8000.0, amplitude, 1.0, SR));
    let rms = (interior(&out)
        .iter()
        .map(|&v| v as f64 * v as f64)
        .sum::<f64>()
        / interior(&out).len() as f64)
        .sqrt();
    let db = 20.0 * (rms / amplitude as f64).log10();
    assert!(db < -60.0, "8 kHz at pitch 2 left {db:.1} dB");
}

#[test]
fn stretched_sine_has_no_jumps_or_dips() {
    let amplitude = 0.5;
    // 200 Hz: a period divides the 15 ms hop; 173 Hz: no period fits the hops evenly.
    for freq in [200.0, 173.0] {
        let input = sine(freq, amplitude, 2.0, SR);
        let original_step = max_step(&input);
        for (rate, pitch) in [
            (0.5, 1.0),
            (1.5, 1.0),
            (2.0, 1.0),
            (3.0, 1.0),
            (1.0, 1.5),
            (2.0, 0.75),
        ] {
            let out = one_shot(rate, pitch, 1.0, &input);
            let middle = interior(&out);
            // A sine's largest step grows with its frequency, which pitch multiplies.
            let step = max_step(middle);
            assert!(
            step <= original_step * pitch * 1.02,
            "{freq} Hz, rate {rate} pitch {pitch}: largest step {step}, a sine of that frequency has {}",
            original_step * pitch
        );
            // Misaligned frames would cancel partly where they overlap: every 10 ms block keeps the amplitude.
            for block in middle.chunks_exact(samples(0.010, SR)) {
                let peak = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                assert!(
                (peak / amplitude - 1.0).abs() <= 0.02,
                "{freq} Hz, rate {rate} pitch {pitch}: a 10 ms block peaks at {peak}, the sine at {amplitude}"
            );
            }
        }
    }
}

#[test]
fn silence_stays_silence() {
    let input = vec![0.0f32; samples(1.0, SR)];
    for (rate, pitch, volume) in [
        (2.0, 1.0, 1.0),
        (0.5, 1.0, 4.0),
        (1.0, 1.7, 1.0),
        (3.0, 0.6, 2.0),
    ] {
        let out = one_shot(rate, pitch, volume, &input);
        assert!(!out.is_empty());
        assert!(
            out.iter().all(|&v| v == 0.0),
            "rate {rate} pitch {pitch} volume {volume}: silence came out as sound"
        );
    }
}

#[test]
fn volume_gain_is_exact_on_a_quiet_signal() {
    // 0.3 × 2.5 = 0.75: below the limiter's knee, so the gain must be a plain product.
    let input = speech_like(1.0).iter().map(|v| v * 0.6).collect::<Vec<_>>();
    let mut filter = ProsodyFilter::new(SR, 1.0, 1.0, 2.5);
    let mut out = Vec::new();
    for chunk in input.chunks(500) {
        filter.process(chunk, &mut out);
        assert_eq!(out.len() % 500, 0, "a gain alone must not delay");
    }
    filter.finish(&mut out);
    assert_eq!(out.len(), input.len());
    for (i, (&x, &y)) in input.iter().zip(&out).enumerate() {
        assert_eq!(y.to_bits(), (x * 2.5).to_bits(), "sample {i}");
    }
    // Behind a stretch too: the gain multiplies what the stretch alone gives.
    let plain = one_shot(2.0, 1.0, 1.0, &input);
    let louder = one_shot(2.0, 1.0, 1.5, &input);
    assert_eq!(plain.len(), louder.len());
    for (i, (&x, &y)) in plain.iter().zip(&louder).enumerate() {
        assert_eq!(y.to_bits(), (x * 1.5).to_bits(), "sample {i}");
    }
}

#[test]
fn loud_gain_is_softly_limited_below_one() {
    let input = sine(200.0, 1.0, 0.5, SR);
    let out = one_shot(1.0, 1.0, 4.0, &input);
    assert_eq!(out.len(), input.len());
    assert!(
        out.iter().all(|v| v.abs() <= 1.0),
        "output beyond full scale"
    );
    // Above the knee the curve keeps order and sign: louder input, louder output.
    for (&x, &y) in input.iter().zip(&out) {
        assert_eq!(x.signum(), y.signum());
    }
    let mut pairs: Vec<(f32, f32)> = input.iter().zip(&out).map(|(&x, &y)| (x, y)).collect();
    pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(
        pairs.windows(2).all(|p| p[1].1 >= p[0].1),
        "limiter is not monotonic"
    );
    // The peak is clearly limited, not clipped flat at a lower level.
    let peak = out.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(peak > 0.99, "peak {peak}");
}

#[test]
fn extreme_and_nan_parameters_are_clamped() {
    let cases = [
        // A NaN gain is silence times an overflow: silent.
        ((f32::NAN, f32::NAN, f32::NAN), (1.0, 1.0, 0.0)),
        (
            (f32::INFINITY, f32::INFINITY, f32::INFINITY),
            (4.0, 2.0, 4.0),
        ),
        (
            (f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY),
            (0.25, 0.5, 0.0),
        ),
        ((0.0, 0.0, -1.0), (0.25, 0.5, 0.0)),
        ((100.0, 100.0, 100.0), (4.0, 2.0, 4.0)),
        ((-3.0, 1e-30, 1e30), (0.25, 0.5, 4.0)),
    ];
    let input = voiced(120.0, 0.5);
    for ((rate, pitch, volume), expected) in cases {
        let mut filter = ProsodyFilter::new(SR, rate, pitch, volume);
        assert_eq!((filter.rate(), filter.pitch(), filter.volume()), expected);
        let out = chunked(&mut filter, &input, || 700);
        assert!(out.iter().all(|v| v.is_finite() && v.abs() <= 1.0));
        let wanted = input.len() as f64 / expected.0 as f64;
        assert!((out.len() as f64 - wanted).abs() <= 0.01 * wanted + 720.0);
    }
    // Whatever the sample rate, even none: frames shrink to a few samples, nothing panics.
    for sample_rate in [0, 1, 100, 192_000, u32::MAX] {
        let mut filter = ProsodyFilter::new(sample_rate, 2.0, 1.5, 1.0);
        let out = chunked(&mut filter, &input, || 333);
        assert!(out.iter().all(|v| v.is_finite()));
    }
}

#[test]
fn nan_and_infinite_samples_are_taken_as_silence() {
    let mut input = voiced(120.0, 0.5);
    let mut silenced = input.clone();
    for i in [100, 5000, 5001, 9000] {
        input[i] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::NAN][i % 4];
        silenced[i] = 0.0;
    }
    for (rate, pitch, volume) in [
        (1.0, 1.0, 2.0),
        (2.0, 1.0, 1.0),
        (1.0, 1.5, 1.0),
        (0.7, 1.2, 0.5),
    ] {
        let out = one_shot(rate, pitch, volume, &input);
        assert!(out.iter().all(|v| v.is_finite()));
        assert_eq!(out, one_shot(rate, pitch, volume, &silenced));
    }
}

#[test]
fn empty_chunks_finish_and_reuse() {
    let input = speech_like(0.5);
    for (rate, pitch, volume) in [
        (1.0, 1.0, 1.0),
        (2.0, 1.0, 1.0),
        (1.0, 1.4, 1.0),
        (0.6, 0.8, 2.0),
    ] {
        let mut filter = ProsodyFilter::new(SR, rate, pitch, volume);
        let mut out = Vec::new();
        filter.process(&[], &mut out);
        filter.finish(&mut out);
        filter.finish(&mut out);
        assert!(out.is_empty(), "nothing in, nothing out");
        let mut size = [0, 100, 0, 0, 2000].into_iter().cycle();
        let first = chunked(&mut filter, &input, || size.next().unwrap());
        // `finish` left it ready for the next utterance: the same input gives the same output.
        let second = chunked(&mut filter, &input, || 1920);
        assert_eq!(first, second);
        assert_eq!(first, one_shot(rate, pitch, volume, &input));
        // A stopped utterance leaves nothing behind.
        filter.process(&input[..5000], &mut Vec::new());
        filter.reset();
        assert_eq!(chunked(&mut filter, &input, || 480), first);
    }
    // Inputs shorter than one frame still come out, shortened by the rate.
    for len in [1, 10, 300, 719] {
        let out = one_shot(2.0, 1.0, 1.0, &input[..len]);
        assert_eq!(
            out.len(),
            (len as f64 / 2.0).round() as usize,
            "{len} samples in"
        );
    }
}

/// The delay, in input samples: how much input went in beyond what the output so far stands for.
#[test]
fn delay_is_bounded() {
    let input = speech_like(1.0);
    for (rate, pitch) in [
        (0.25, 1.0),
        (0.5, 1.0),
        (1.0, 1.0),
        (2.0, 1.0),
        (4.0, 1.0),
        (1.0, 2.0),
        (1.0, 0.5),
    ] {
        let mut filter = ProsodyFilter::new(SR, rate, pitch, 1.0);
        let mut out = Vec::new();
        let mut first_sound = None;
        let mut worst = 0.0f64;
        for (n, x) in input.iter().enumerate() {
            filter.process(std::slice::from_ref(x), &mut out);
            if first_sound.is_none() && !out.is_empty() {
                first_sound = Some(n + 1);
            }
            worst = worst.max((n + 1) as f64 - out.len() as f64 * rate as f64);
        }
        let first_ms = first_sound.unwrap() as f64 * 1000.0 / SR as f64;
        let worst_ms = worst * 1000.0 / SR as f64;
        eprintln!("rate {rate} pitch {pitch}: first sound after {first_ms:.1} ms of input, delay ≤ {worst_ms:.1} ms");
        // One 30 ms frame before the first sound (plus the resampler's kernel), then frame + tolerance.
        assert!(
            first_ms <= 33.0,
            "rate {rate} pitch {pitch}: first sound after {first_ms} ms"
        );
        assert!(
            worst_ms <= 45.0,
            "rate {rate} pitch {pitch}: delay {worst_ms} ms"
        );
    }
}

#[test]
fn other_sample_rates() {
    for sample_rate in [16_000, 48_000] {
        let input = sine(200.0, 0.5, 2.0, sample_rate);
        for (rate, pitch) in [(2.0, 1.0), (0.5, 1.0), (1.0, 1.5)] {
            let mut filter = ProsodyFilter::new(sample_rate, rate, pitch, 1.0);
            let out = chunked(&mut filter, &input, || 1000);
            let expected = input.len() as f64 / rate as f64;
            assert!(
                (out.len() as f64 - expected).abs() <= 0.01 * expected + 0.03 * sample_rate as f64
            );
            let freq = zero_crossing_frequency(interior(&out), sample_rate);
            assert_within(
                freq,
                200.0 * pitch as f64,
                0.02,
                &format!("{sample_rate} Hz, rate {rate} pitch {pitch}"),
            );
        }
    }
}

/// Seconds of audio handled per second on one core, in 80 ms chunks as the decoder delivers them.
#[test]
fn runs_far_faster_than_real_time() {
    let input = speech_like(20.0);
    for (rate, pitch) in [(2.0, 1.0), (3.0, 1.0), (0.5, 1.0), (1.0, 1.5), (2.0, 0.8)] {
        let mut filter = ProsodyFilter::new(SR, rate, pitch, 1.0);
        let start = Instant::now();
        let out = chunked(&mut filter, &input, || 1920);
        let seconds = start.elapsed().as_secs_f64();
        let speed = input.len() as f64 / SR as f64 / seconds;
        eprintln!(
            "rate {rate} pitch {pitch}: {speed:.0}× real time ({} samples out)",
            out.len()
        );
        // Hundreds expected; a floor far below that still fails on a real slowdown, not on a busy machine.
        assert!(
            speed >= 20.0,
            "rate {rate} pitch {pitch}: only {speed:.1}× real time"
        );
    }
}
