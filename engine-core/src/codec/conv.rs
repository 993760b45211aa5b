//! The codec's causal convolution modules: zero left padding of `(k−1)·dilation` (all decoder convs have
//! stride 1, so the official "extra" right padding is always zero), transposed convolutions trimmed on the right
//! by `k − stride`, and SnakeBeta.
//!
//! Mirrors `Qwen3TTSTokenizerV2CausalConvNet`, `Qwen3TTSTokenizerV2CausalTransConvNet` and `SnakeBeta` in
//! qwen-tts 0.1.1's `qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`.
//!
//! Each module runs on a chunk of new columns with a state carried from the previous chunk: a convolution keeps
//! its last `(k−1)·dilation` input columns (initially zeros: the causal padding), a transposed convolution its
//! last `⌈k / stride⌉ − 1` input columns (those its next outputs still read). A one-shot decode is one chunk from
//! a fresh state, so chunked and one-shot decodes run the same code, and each of these modules' outputs is the
//! same sum in the same order whatever the chunking, so the same bits on a backend whose kernels fix their order
//! (the CPU's tile kernels). Carrying a transposed convolution's overlapping outputs instead, and adding them to
//! the next chunk's, summed them in another order: the same text with and without SSML marks (which cut the
//! chunks elsewhere) differed by 6e-7 on the AVX2 and `gemm` convolution paths.

use kazeia_backend_abi::{Backend, Combine, Strided, View, Weight, WeightData, WeightFormat};

use crate::error::Result;
use crate::graph::{Graph, Tensor};
use crate::linear::upload;
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

    /// `[channels][pad + len]`: the carried columns then `x`; the last `pad` columns are carried to the next
    /// chunk.
    fn extend<'m>(
        &'m mut self,
        g: &mut Graph<'m>,
        x: &Tensor,
        channels: usize,
        len: usize,
    ) -> Tensor {
        let pad = self.pad;
        let width = pad + len;
        let tail = g.state(&mut self.tail);
        let out = g.zeros(channels * width);
        let columns = |cols, from: View, to: View| Strided {
            rows: channels,
            cols,
            src: from,
            dst: to,
        };
        g.strided(
            Combine::Copy,
            &tail,
            &out,
            columns(pad, View::rows(0, pad), View::rows(0, width)),
        );
        g.strided(
            Combine::Copy,
            x,
            &out,
            columns(len, View::rows(0, len), View::rows(pad, width)),
        );
        g.strided(
            Combine::Copy,
            &out,
            &tail,
            columns(pad, View::rows(len, width), View::rows(0, pad)),
        );
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
        format: WeightFormat,
    ) -> Result<Self> {
        let w = file.tensor_shaped(&format!("{prefix}.conv.weight"), &[cout, cin, k])?;
        let b = file.tensor_shaped(&format!("{prefix}.conv.bias"), &[cout])?;
        Ok(CausalConv1d {
            weight: upload(
                backend,
                WeightData::Conv1d {
                    w: &w,
                    cout,
                    cin,
                    k,
                    bias: Some(&b),
                    format,
                },
            )?,
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
    pub fn forward<'m>(
        &'m self,
        g: &mut Graph<'m>,
        state: &'m mut ConvState,
        x: &Tensor,
        len: usize,
    ) -> Tensor {
        if state.pad == 0 {
            return self.forward_pointwise(g, x, len);
        }
        let pad = state.pad;
        let extended = state.extend(g, x, self.cin, len);
        let y = g.conv1d(
            &self.weight,
            &extended,
            len + pad,
            self.dilation,
            self.cout * len,
        );
        drop(extended);
        y
    }

    /// A convolution that looks at no earlier column (kernel 1): no state.
    pub fn forward_pointwise<'m>(&'m self, g: &mut Graph<'m>, x: &Tensor, len: usize) -> Tensor {
        assert_eq!(
            (self.k - 1) * self.dilation,
            0,
            "a convolution with context needs its state"
        );
        g.conv1d(&self.weight, x, len, self.dilation, self.cout * len)
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
            weight: upload(
                backend,
                WeightData::DepthwiseConv1d {
                    w: &w,
                    channels,
                    k,
                    bias: Some(&b),
                },
            )?,
            channels,
            k,
        })
    }

    pub fn new_state(&self) -> ConvState {
        ConvState::new(self.channels, self.k - 1)
    }

    pub fn forward<'m>(
        &'m self,
        g: &mut Graph<'m>,
        state: &'m mut ConvState,
        x: &Tensor,
        len: usize,
    ) -> Tensor {
        let extended = state.extend(g, x, self.channels, len);
        let y = g.depthwise_conv1d(
            &self.weight,
            &extended,
            len + self.k - 1,
            self.channels * len,
        );
        drop(extended);
        y
    }
}

/// `Qwen3TTSTokenizerV2CausalTransConvNet`: `ConvTranspose1d` whose last `k − stride` outputs are dropped,
/// tensors `{prefix}.conv.{weight,bias}`.
pub struct CausalConvTranspose1d {
    weight: Weight,
    bias: Vec<f32>,
    cin: usize,
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
        format: WeightFormat,
    ) -> Result<Self> {
        let w = file.tensor_shaped(&format!("{prefix}.conv.weight"), &[cin, cout, k])?;
        let bias = file.tensor_shaped(&format!("{prefix}.conv.bias"), &[cout])?;
        Ok(CausalConvTranspose1d {
            weight: upload(
                backend,
                WeightData::ConvTranspose1d {
                    w: &w,
                    cin,
                    cout,
                    k,
                    stride,
                    format,
                },
            )?,
            bias,
            cin,
            cout,
            k,
            stride,
        })
    }

    /// Output columns per input column (the official trim keeps exactly `len · stride`).
    pub fn out_len(&self, len: usize) -> usize {
        len * self.stride
    }

    /// The last `⌈k / stride⌉ − 1` input columns, which the next chunk's first outputs read.
    pub fn new_state(&self) -> ConvState {
        ConvState::new(self.cin, self.k.div_ceil(self.stride) - 1)
    }

    /// `x[cin][len]` → `y[cout][len · stride]`: input position `m` gives output columns `m·stride + r` (the
    /// official trim keeps them up to the last input's), each the sum over the taps `r + j·stride` of the inputs
    /// `m − j`, `j` up to the carried columns' reach. The transposed convolution runs on the carried columns
    /// then `x`, and keeps the outputs of `x`'s positions, which read no column before the carried ones.
    pub fn forward<'m>(
        &'m self,
        g: &mut Graph<'m>,
        state: &'m mut ConvState,
        x: &Tensor,
        len: usize,
    ) -> Tensor {
        assert!(
            self.k >= self.stride,
            "kernel shorter than the stride is not a causal upsampler"
        );
        let reach = state.pad;
        let extended = state.extend(g, x, self.cin, len);
        let full = (reach + len - 1) * self.stride + self.k;
        let y_full = g.conv_transpose1d(&self.weight, &extended, reach + len, self.cout * full);
        drop(extended);
        let out_len = self.out_len(len);
        let y = g.zeros(self.cout * out_len);
        g.strided(
            Combine::Copy,
            &y_full,
            &y,
            Strided {
                rows: self.cout,
                cols: out_len,
                src: View::rows(reach * self.stride, full),
                dst: View::rows(0, out_len),
            },
        );
        drop(y_full);
        let bias = g.constant(&self.bias);
        g.strided(
            Combine::Add,
            &bias,
            &y,
            Strided {
                rows: self.cout,
                cols: out_len,
                src: View::per_row(),
                dst: View::rows(0, out_len),
            },
        );
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

    /// In place on `x[channels][len]`.
    pub fn forward<'m>(&'m self, g: &mut Graph<'m>, x: &Tensor, len: usize) {
        g.snake_beta(x, len, &self.alpha, &self.inv_beta);
    }
}
