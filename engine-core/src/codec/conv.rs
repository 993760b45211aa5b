//! The codec's causal convolution modules: zero left padding of `(k−1)·dilation` (all decoder convs have
//! stride 1, so the official "extra" right padding is always zero), transposed convolutions trimmed on the right
//! by `k − stride`, and SnakeBeta.
//!
//! Each module runs on a chunk of new columns with a state carried from the previous chunk: a convolution keeps
//! its last `(k−1)·dilation` input columns (initially zeros: the causal padding), a transposed convolution keeps
//! the `k − stride` output columns that later input still adds to. A one-shot decode is one chunk from a fresh
//! state, so chunked and one-shot decodes run the same code.

use kazeia_backend_abi::{Backend, Weight};

use crate::error::Result;
use crate::weights::Weights;

/// The last `pad` input columns of a causal convolution, `[channels][pad]`; zeros before the first chunk.
#[derive(Clone)]
pub struct ConvState {
    tail: Vec<f32>,
    pad: usize,
}

impl ConvState {
    pub fn new(channels: usize, pad: usize) -> Self {
        ConvState {
            tail: vec![0.0; channels * pad],
            pad,
        }
    }

    /// `[channels][pad + len]`: the carried columns then `x`; keeps the last `pad` columns for the next chunk.
    fn extend(&mut self, x: &[f32], channels: usize, len: usize) -> Vec<f32> {
        let pad = self.pad;
        let width = pad + len;
        let mut out = vec![0.0; channels * width];
        for c in 0..channels {
            let row = &mut out[c * width..(c + 1) * width];
            row[..pad].copy_from_slice(&self.tail[c * pad..(c + 1) * pad]);
            row[pad..].copy_from_slice(&x[c * len..(c + 1) * len]);
            self.tail[c * pad..(c + 1) * pad].copy_from_slice(&row[len..]);
        }
        out
    }
}

/// `Qwen3TTSTokenizerV2CausalConvNet` (groups = 1, stride 1), tensors `{prefix}.conv.{weight,bias}`.
pub struct CausalConv1d {
    weight: Weight,
    pub cin: usize,
    pub cout: usize,
    k: usize,
    dilation: usize,
}

impl CausalConv1d {
    pub fn load(
        backend: &dyn Backend,
        file: &dyn Weights,
        prefix: &str,
        (cin, cout, k): (usize, usize, usize),
        dilation: usize,
    ) -> Result<Self> {
        let w = file.tensor_shaped(&format!("{prefix}.conv.weight"), &[cout, cin, k])?;
        let b = file.tensor_shaped(&format!("{prefix}.conv.bias"), &[cout])?;
        Ok(CausalConv1d {
            weight: backend.upload_conv1d(&w, cout, cin, k, Some(&b)),
            cin,
            cout,
            k,
            dilation,
        })
    }

    pub fn new_state(&self) -> ConvState {
        ConvState::new(self.cin, (self.k - 1) * self.dilation)
    }

    /// `x[cin][len]` → `y[cout][len]`, continuing after `state`.
    pub fn forward(
        &self,
        backend: &dyn Backend,
        state: &mut ConvState,
        x: &[f32],
        len: usize,
    ) -> Vec<f32> {
        let mut y = vec![0.0; self.cout * len];
        if state.pad == 0 {
            backend.conv1d(&self.weight, x, len, self.dilation, &mut y);
        } else {
            let extended = state.extend(x, self.cin, len);
            backend.conv1d(
                &self.weight,
                &extended,
                len + state.pad,
                self.dilation,
                &mut y,
            );
        }
        y
    }
}

/// The depthwise causal convolution of a ConvNeXt block, tensors `{prefix}.conv.{weight,bias}`.
pub struct CausalDepthwiseConv1d {
    weight: Weight,
    channels: usize,
    k: usize,
}

impl CausalDepthwiseConv1d {
    pub fn load(
        backend: &dyn Backend,
        file: &dyn Weights,
        prefix: &str,
        channels: usize,
        k: usize,
    ) -> Result<Self> {
        let w = file.tensor_shaped(&format!("{prefix}.conv.weight"), &[channels, 1, k])?;
        let b = file.tensor_shaped(&format!("{prefix}.conv.bias"), &[channels])?;
        Ok(CausalDepthwiseConv1d {
            weight: backend.upload_depthwise_conv1d(&w, channels, k, Some(&b)),
            channels,
            k,
        })
    }

    pub fn new_state(&self) -> ConvState {
        ConvState::new(self.channels, self.k - 1)
    }

    pub fn forward(
        &self,
        backend: &dyn Backend,
        state: &mut ConvState,
        x: &[f32],
        len: usize,
    ) -> Vec<f32> {
        let extended = state.extend(x, self.channels, len);
        let mut y = vec![0.0; self.channels * len];
        backend.depthwise_conv1d(&self.weight, &extended, len + self.k - 1, &mut y);
        y
    }
}

/// `Qwen3TTSTokenizerV2CausalTransConvNet`: `ConvTranspose1d` whose last `k − stride` outputs are dropped,
/// tensors `{prefix}.conv.{weight,bias}`.
pub struct CausalConvTranspose1d {
    weight: Weight,
    bias: Vec<f32>,
    pub cout: usize,
    k: usize,
    pub stride: usize,
}

impl CausalConvTranspose1d {
    pub fn load(
        backend: &dyn Backend,
        file: &dyn Weights,
        prefix: &str,
        (cin, cout, k): (usize, usize, usize),
        stride: usize,
    ) -> Result<Self> {
        let w = file.tensor_shaped(&format!("{prefix}.conv.weight"), &[cin, cout, k])?;
        let bias = file.tensor_shaped(&format!("{prefix}.conv.bias"), &[cout])?;
        Ok(CausalConvTranspose1d {
            weight: backend.upload_conv_transpose1d(&w, cin, cout, k, stride),
            bias,
            cout,
            k,
            stride,
        })
    }

    /// Output columns per input column (the official trim keeps exactly `len · stride`).
    pub fn out_len(&self, len: usize) -> usize {
        len * self.stride
    }

    /// The `[cout][k − stride]` overlap carried between chunks (bias not yet added).
    pub fn new_state(&self) -> Vec<f32> {
        vec![0.0; self.cout * self.k.saturating_sub(self.stride)]
    }

    /// `x[cin][len]` → `y[cout][len · stride]`: the full transposed convolution plus the previous chunk's
    /// overlap; the new overlap is carried (the one-shot decode drops it: the official right trim).
    pub fn forward(
        &self,
        backend: &dyn Backend,
        carry: &mut [f32],
        x: &[f32],
        len: usize,
    ) -> Vec<f32> {
        assert!(
            self.k >= self.stride,
            "kernel shorter than the stride is not a causal upsampler"
        );
        let full = (len - 1) * self.stride + self.k;
        let overlap = self.k - self.stride;
        let out_len = self.out_len(len);
        let mut y_full = vec![0.0; self.cout * full];
        backend.conv_transpose1d(&self.weight, x, len, &mut y_full);
        let mut y = Vec::with_capacity(self.cout * out_len);
        for (c, (row, b)) in y_full.chunks_exact_mut(full).zip(&self.bias).enumerate() {
            let carried = &mut carry[c * overlap..(c + 1) * overlap];
            for (v, old) in row.iter_mut().zip(carried.iter()) {
                *v += old;
            }
            carried.copy_from_slice(&row[out_len..]);
            y.extend(row[..out_len].iter().map(|v| v + b));
        }
        y
    }
}

/// SnakeBeta with log-scale parameters `{prefix}.{alpha,beta}`: `x + 1/(e^β + 1e-9) · sin(e^α · x)²`.
pub struct SnakeBeta {
    alpha: Vec<f32>,
    inv_beta: Vec<f32>,
}

impl SnakeBeta {
    pub fn load(file: &dyn Weights, prefix: &str, channels: usize) -> Result<Self> {
        let alpha = file.tensor_shaped(&format!("{prefix}.alpha"), &[channels])?;
        let beta = file.tensor_shaped(&format!("{prefix}.beta"), &[channels])?;
        Ok(SnakeBeta {
            alpha: alpha.iter().map(|a| a.exp()).collect(),
            inv_beta: beta.iter().map(|b| 1.0 / (b.exp() + 1e-9)).collect(),
        })
    }

    pub fn forward(&self, backend: &dyn Backend, x: &mut [f32], len: usize) {
        backend.snake_beta(x, len, &self.alpha, &self.inv_beta);
    }
}

/// `[rows][cols]` → `[cols][rows]`.
pub fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; rows * cols];
    for (r, row) in x.chunks_exact(cols).enumerate() {
        for (c, v) in row.iter().enumerate() {
            out[c * rows + r] = *v;
        }
    }
    out
}
