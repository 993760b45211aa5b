//! Short raised-cosine fades, so that audio cut short (a stop, a cancel, a higher-priority message) or
//! taken up again after a gap (the audio server restarted) does not step to or from silence: a step is
//! heard as a click, a "crack" when a screen reader interrupts speech key after key.

use std::f32::consts::PI;
use std::time::Duration;

/// Long enough that the fade steps by less than speech does (at 24 kHz a 5 ms raised cosine changes the
/// gain by at most 1.3 % per sample), short enough that a stop still silences within 20 ms.
pub const FADE: Duration = Duration::from_millis(5);

/// Samples in [`FADE`] at `rate`.
pub fn fade_len(rate: u32) -> usize {
    (rate as usize * FADE.as_millis() as usize / 1000).max(1)
}

/// The gain of sample `i` of an `n`-sample fade out: from just under 1 to just over 0 (neither end is a
/// step: the sample before is at 1, the silence after at 0).
fn gain_out(i: usize, n: usize) -> f32 {
    0.5 * (1.0 + (PI * (i + 1) as f32 / (n + 1) as f32).cos())
}

/// Fades `samples` out over their whole length.
pub fn fade_out(samples: &mut [f32]) {
    let n = samples.len();
    for (i, s) in samples.iter_mut().enumerate() {
        *s *= gain_out(i, n);
    }
}

/// Fades in the first `n` samples of the samples `parts` hold in order (`n` counts from the first of
/// them, across parts).
pub fn fade_in<'a>(parts: impl IntoIterator<Item = &'a mut [f32]>, n: usize) {
    let mut i = 0;
    for part in parts {
        for s in part {
            if i >= n {
                return;
            }
            *s *= gain_out(n - 1 - i, n);
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fades_reach_silence_and_full_level_without_a_step() {
        let n = fade_len(24_000);
        assert_eq!(n, 120);
        let mut out = vec![1.0f32; n];
        fade_out(&mut out);
        // From 1 (the sample before) down to 0 (the silence after): no step larger than the cosine's.
        let path: Vec<f32> = [1.0]
            .into_iter()
            .chain(out.iter().copied())
            .chain([0.0])
            .collect();
        let largest = path
            .windows(2)
            .map(|w| (w[1] - w[0]).abs())
            .fold(0.0, f32::max);
        assert!(largest <= PI / 2.0 / (n + 1) as f32 + 1e-6, "{largest}");
        assert!(path.windows(2).all(|w| w[1] <= w[0]));
        // The fade in is the fade out backwards, across the parts it is given.
        let (mut a, mut b) = (vec![1.0f32; 50], vec![1.0f32; 100]);
        fade_in([&mut a[..], &mut b[..]], n);
        let joined: Vec<f32> = a.iter().chain(&b).copied().collect();
        for i in 0..n {
            assert!((joined[i] - out[n - 1 - i]).abs() < 1e-6, "{i}");
        }
        assert!(joined[n..].iter().all(|&s| s == 1.0));
    }
}
