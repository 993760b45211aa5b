//! The two ×ratio upsampling stages between the pre-transformer and the vocoder: a transposed convolution
//! (kernel = stride) followed by a ConvNeXt block.
//!
//! Mirrors `Qwen3TTSTokenizerV2Decoder.upsample`: `Qwen3TTSTokenizerV2CausalTransConvNet` and
//! `Qwen3TTSTokenizerV2ConvNeXtBlock`, in qwen-tts 0.1.1's
//! `qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`.

use kazeia_backend_abi::{Backend, Combine, Strided, View, Weight, WeightFormat};

use super::conv::{CausalConvTranspose1d, CausalDepthwiseConv1d, ConvState};
use crate::error::Result;
use crate::graph::{Graph, Tensor};
use crate::linear::upload;
use crate::weights::Weights;

/// ConvNeXt block: depthwise causal conv k7 → LayerNorm over channels → Linear ×4 → GELU → Linear → ×γ →
/// + residual.
struct ConvNeXt {
    dwconv: CausalDepthwiseConv1d,
    norm_weight: Vec<f32>,
    norm_bias: Vec<f32>,
    pwconv1: Weight,
    pwconv2: Weight,
    gamma: Vec<f32>,
    dim: usize,
}

impl ConvNeXt {
    fn load(
        backend: &dyn Backend,
        file: &dyn Weights,
        prefix: &str,
        dim: usize,
        format: WeightFormat,
    ) -> Result<Self> {
        let linear = |w: &[f32], out, inp, bias: &[f32]| {
            upload(
                backend,
                kazeia_backend_abi::WeightData::Linear {
                    w,
                    out,
                    inp,
                    bias: Some(bias),
                    format,
                },
            )
        };
        let t =
            |name: &str, shape: &[usize]| file.tensor_shaped(&format!("{prefix}.{name}"), shape);
        let w1 = t("pwconv1.weight", &[4 * dim, dim])?;
        let b1 = t("pwconv1.bias", &[4 * dim])?;
        let w2 = t("pwconv2.weight", &[dim, 4 * dim])?;
        let b2 = t("pwconv2.bias", &[dim])?;
        Ok(ConvNeXt {
            dwconv: CausalDepthwiseConv1d::load(
                backend,
                file,
                &format!("{prefix}.dwconv"),
                dim,
                7,
            )?,
            norm_weight: t("norm.weight", &[dim])?,
            norm_bias: t("norm.bias", &[dim])?,
            pwconv1: linear(&w1, 4 * dim, dim, &b1)?,
            pwconv2: linear(&w2, dim, 4 * dim, &b2)?,
            gamma: t("gamma", &[dim])?,
            dim,
        })
    }

    /// In place on `x[dim][len]`.
    fn forward<'m>(&'m self, g: &mut Graph<'m>, state: &'m mut ConvState, x: &Tensor, len: usize) {
        let dim = self.dim;
        let dw = self.dwconv.forward(g, state, x, len);
        let rows = g.transpose(&dw, dim, len);
        drop(dw);
        g.layer_norm(&rows, dim, &self.norm_weight, &self.norm_bias, 1e-6);
        let wide = g.linear(&self.pwconv1, &rows, len, 4 * dim);
        drop(rows);
        g.gelu(&wide);
        let branch = g.linear(&self.pwconv2, &wide, len, dim);
        drop(wide);
        // x[c][t] += γ[c] · branch[t][c]
        g.scale_columns(&branch, len, &self.gamma);
        g.strided(
            Combine::Add,
            &branch,
            x,
            Strided {
                rows: dim,
                cols: len,
                src: View::transposed(dim),
                dst: View::rows(0, len),
            },
        );
        drop(branch);
    }
}

pub struct UpsampleStage {
    transconv: CausalConvTranspose1d,
    convnext: ConvNeXt,
}

/// What a stage carries between chunks.
#[derive(Clone)]
pub struct UpsampleState {
    context: ConvState,
    dwconv: ConvState,
}

impl UpsampleStage {
    pub fn load(
        backend: &dyn Backend,
        file: &dyn Weights,
        prefix: &str,
        dim: usize,
        factor: usize,
        format: WeightFormat,
    ) -> Result<Self> {
        Ok(UpsampleStage {
            transconv: CausalConvTranspose1d::load(
                backend,
                file,
                &format!("{prefix}.0"),
                (dim, dim, factor),
                factor,
                format,
            )?,
            convnext: ConvNeXt::load(backend, file, &format!("{prefix}.1"), dim, format)?,
        })
    }

    pub fn new_state(&self) -> UpsampleState {
        UpsampleState {
            context: self.transconv.new_state(),
            dwconv: self.convnext.dwconv.new_state(),
        }
    }

    /// `x[dim][len]` → `(y[dim][len·factor], len·factor)`, continuing after `state`.
    pub fn forward<'m>(
        &'m self,
        g: &mut Graph<'m>,
        state: &'m mut UpsampleState,
        x: &Tensor,
        len: usize,
    ) -> (Tensor, usize) {
        let UpsampleState { context, dwconv } = state;
        let y = self.transconv.forward(g, context, x, len);
        let out_len = self.transconv.out_len(len);
        self.convnext.forward(g, dwconv, &y, out_len);
        (y, out_len)
    }
}
