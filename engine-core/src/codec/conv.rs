//! The codec's causal convolution modules: zero left padding of `(k−1)·dilation` (all decoder convs have
//! stride 1, so the official "extra" right padding is always zero), transposed convolutions trimmed on the right
//! by `k − stride`, and SnakeBeta.

use kazeia_backend_abi::{Backend, Weight};

use crate::error::Result;
use crate::weights::Weights;

/// Prepends `pad` zero columns to each channel of `x[channels][len]`.
pub fn left_pad(x: &[f32], channels: usize, len: usize, pad: usize) -> Vec<f32> {
    let mut out = vec![0.0; channels * (len + pad)];
    for (dst, src) in out.chunks_exact_mut(len + pad).zip(x.chunks_exact(len)) {
        dst[pad..].copy_from_slice(src);
    }
    out
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

    /// `x[cin][len]` → `y[cout][len]`.
    pub fn forward(&self, backend: &dyn Backend, x: &[f32], len: usize) -> Vec<f32> {
        let pad = (self.k - 1) * self.dilation;
        let mut y = vec![0.0; self.cout * len];
        if pad == 0 {
            backend.conv1d(&self.weight, x, len, self.dilation, &mut y);
        } else {
            let padded = left_pad(x, self.cin, len, pad);
            backend.conv1d(&self.weight, &padded, len + pad, self.dilation, &mut y);
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

    pub fn forward(&self, backend: &dyn Backend, x: &[f32], len: usize) -> Vec<f32> {
        let padded = left_pad(x, self.channels, len, self.k - 1);
        let mut y = vec![0.0; self.channels * len];
        backend.depthwise_conv1d(&self.weight, &padded, len + self.k - 1, &mut y);
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

    /// Output length for `len` input columns.
    pub fn out_len(&self, len: usize) -> usize {
        let full = (len - 1) * self.stride + self.k;
        full - self.k.saturating_sub(self.stride)
    }

    /// `x[cin][len]` → `y[cout][out_len(len)]`.
    pub fn forward(&self, backend: &dyn Backend, x: &[f32], len: usize) -> Vec<f32> {
        let full = (len - 1) * self.stride + self.k;
        let mut y_full = vec![0.0; self.cout * full];
        backend.conv_transpose1d(&self.weight, x, len, &mut y_full);
        let out_len = self.out_len(len);
        let mut y = Vec::with_capacity(self.cout * out_len);
        for (row, b) in y_full.chunks_exact(full).zip(&self.bias) {
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
