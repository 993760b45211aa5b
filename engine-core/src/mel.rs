//! The speaker encoder's front end, as `qwen-tts` computes it (`mel_spectrogram` in the official modeling
//! file): 24 kHz audio, reflect padding of `(n_fft − hop) / 2` on each side, an uncentred STFT with a periodic
//! Hann window (n_fft 1024, hop 256), magnitude `sqrt(re² + im² + 1e-9)`, librosa's Slaney-normalised mel
//! filterbank (128 bands, 0–12 kHz), then `ln(max(x, 1e-5))`.
//!
//! The FFT and the filterbank run in f64 (torch's are f32): the result is within rounding of the official one.

use std::sync::Arc;

use rustfft::num_complex::Complex;
use rustfft::{Fft, FftPlanner};

use crate::error::{Error, Result};

pub const SAMPLE_RATE: u32 = 24000;
pub const N_FFT: usize = 1024;
pub const HOP: usize = 256;
pub const N_MELS: usize = 128;
const F_MAX: f64 = 12000.0;

pub struct MelSpectrogram {
    /// `[N_MELS][N_FFT / 2 + 1]`.
    filters: Vec<f64>,
    window: Vec<f64>,
    fft: Arc<dyn Fft<f64>>,
}

impl Default for MelSpectrogram {
    fn default() -> Self {
        Self::new()
    }
}

impl MelSpectrogram {
    pub fn new() -> Self {
        let window = (0..N_FFT)
            .map(|n| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / N_FFT as f64).cos())
            .collect();
        MelSpectrogram {
            filters: slaney_filterbank(SAMPLE_RATE as f64, N_FFT, N_MELS, 0.0, F_MAX),
            window,
            fft: FftPlanner::new().plan_fft_forward(N_FFT),
        }
    }

    /// Frames of a clip: `(len + 2·pad − n_fft) / hop + 1`.
    pub fn frames(samples: usize) -> usize {
        let padded = samples + (N_FFT - HOP);
        if padded < N_FFT {
            0
        } else {
            (padded - N_FFT) / HOP + 1
        }
    }

    /// Log-mel frames of 24 kHz audio, `[frames][N_MELS]`.
    pub fn compute(&self, wav: &[f32]) -> Result<Vec<f32>> {
        let pad = (N_FFT - HOP) / 2;
        if wav.len() <= pad {
            return Err(Error::Input(format!(
                "the audio is too short for a spectrogram ({} samples; at least {} are needed)",
                wav.len(),
                pad + 1
            )));
        }
        let n = wav.len();
        let padded: Vec<f64> = (0..n + 2 * pad)
            .map(|i| {
                let j = i as isize - pad as isize;
                let j = if j < 0 {
                    -j
                } else if j as usize >= n {
                    2 * (n as isize - 1) - j
                } else {
                    j
                };
                wav[j as usize] as f64
            })
            .collect();
        let frames = Self::frames(n);
        let bins = N_FFT / 2 + 1;
        let mut out = Vec::with_capacity(frames * N_MELS);
        let mut buf = vec![Complex::new(0.0, 0.0); N_FFT];
        let mut magnitude = vec![0.0f64; bins];
        for f in 0..frames {
            let start = f * HOP;
            for (i, b) in buf.iter_mut().enumerate() {
                *b = Complex::new(padded[start + i] * self.window[i], 0.0);
            }
            self.fft.process(&mut buf);
            for (m, b) in magnitude.iter_mut().zip(&buf) {
                *m = (b.re * b.re + b.im * b.im + 1e-9).sqrt();
            }
            for band in self.filters.chunks_exact(bins) {
                let e: f64 = band.iter().zip(&magnitude).map(|(w, m)| w * m).sum();
                out.push(e.max(1e-5).ln() as f32);
            }
        }
        Ok(out)
    }
}

fn hz_to_mel(hz: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let logstep = 6.4f64.ln() / 27.0;
    if hz >= min_log_hz {
        min_log_hz / f_sp + (hz / min_log_hz).ln() / logstep
    } else {
        hz / f_sp
    }
}

fn mel_to_hz(mel: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = 6.4f64.ln() / 27.0;
    if mel >= min_log_mel {
        min_log_hz * (logstep * (mel - min_log_mel)).exp()
    } else {
        f_sp * mel
    }
}

/// `librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax)` (Slaney scale and area normalisation), then rounded
/// to f32 as librosa returns it.
fn slaney_filterbank(sr: f64, n_fft: usize, n_mels: usize, fmin: f64, fmax: f64) -> Vec<f64> {
    let bins = n_fft / 2 + 1;
    let fft_freqs: Vec<f64> = (0..bins).map(|i| i as f64 * sr / n_fft as f64).collect();
    let (lo, hi) = (hz_to_mel(fmin), hz_to_mel(fmax));
    let mel_f: Vec<f64> = (0..n_mels + 2)
        .map(|i| mel_to_hz(lo + (hi - lo) * i as f64 / (n_mels + 1) as f64))
        .collect();
    let mut weights = vec![0.0; n_mels * bins];
    for m in 0..n_mels {
        let (f0, f1, f2) = (mel_f[m], mel_f[m + 1], mel_f[m + 2]);
        let enorm = 2.0 / (f2 - f0);
        for (b, &f) in fft_freqs.iter().enumerate() {
            let lower = (f - f0) / (f1 - f0);
            let upper = (f2 - f) / (f2 - f1);
            let w = lower.min(upper).max(0.0) * enorm;
            weights[m * bins + b] = w as f32 as f64;
        }
    }
    weights
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mel_scale_round_trips_and_frames_count() {
        for hz in [0.0, 500.0, 1000.0, 4000.0, 12000.0] {
            assert!((mel_to_hz(hz_to_mel(hz)) - hz).abs() < 1e-9);
        }
        assert_eq!(MelSpectrogram::frames(24000), 93);
        let e = MelSpectrogram::new()
            .compute(&[0.0; 100])
            .unwrap_err()
            .to_string();
        assert!(e.contains("too short"), "{e}");
    }
}
