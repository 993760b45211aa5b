//! Row-wise normalisations. Sums are accumulated in f64: the reference (PyTorch f32) is within rounding of the
//! exact value, and so is this.

use crate::par::chunks_mut;

pub fn rms_norm(parallel: bool, x: &mut [f32], dim: usize, weight: &[f32], eps: f32) {
    assert_eq!(weight.len(), dim, "rms_norm weight size");
    chunks_mut(parallel, x, dim, |_, row| {
        let mean_sq = row.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / dim as f64;
        let inv = 1.0 / ((mean_sq as f32) + eps).sqrt();
        for (v, w) in row.iter_mut().zip(weight) {
            *v = w * (*v * inv);
        }
    });
}

pub fn layer_norm(
    parallel: bool,
    x: &mut [f32],
    dim: usize,
    weight: &[f32],
    bias: &[f32],
    eps: f32,
) {
    assert_eq!(weight.len(), dim, "layer_norm weight size");
    assert_eq!(bias.len(), dim, "layer_norm bias size");
    chunks_mut(parallel, x, dim, |_, row| {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / dim as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / dim as f64;
        let inv = 1.0 / ((var as f32) + eps).sqrt();
        let mean = mean as f32;
        for ((v, w), b) in row.iter_mut().zip(weight).zip(bias) {
            *v = (*v - mean) * inv * w + b;
        }
    });
}
