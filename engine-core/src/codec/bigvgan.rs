//! The vocoder after the upsamplers (`decoder.decoder.*`): conv k7 → SnakeBeta decoder blocks (SnakeBeta →
//! transposed conv ×rate → three residual units with dilations 1, 3, 9) → SnakeBeta → conv k7 to one channel.
//!
//! Mirrors `Qwen3TTSTokenizerV2Decoder.decoder`: `Qwen3TTSTokenizerV2CausalConvNet`,
//! `Qwen3TTSTokenizerV2DecoderDecoderBlock` (its `Qwen3TTSTokenizerV2DecoderDecoderResidualUnit`s) and
//! `SnakeBeta`, in qwen-tts 0.1.1's `qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`.

use kazeia_backend_abi::{Backend, Combine, Strided, WeightFormat};

use super::config::DecoderConfig;
use super::conv::{CausalConv1d, CausalConvTranspose1d, ConvState, SnakeBeta};
use super::Trace;
use crate::error::Result;
use crate::graph::{Graph, Tensor};
use crate::weights::Weights;

/// SnakeBeta → dilated causal conv k7 → SnakeBeta → conv k1 → + residual.
struct ResidualUnit {
    act1: SnakeBeta,
    conv1: CausalConv1d,
    act2: SnakeBeta,
    conv2: CausalConv1d,
}

impl ResidualUnit {
    fn load(
        backend: &dyn Backend,
        file: &dyn Weights,
        prefix: &str,
        dim: usize,
        dilation: usize,
        format: WeightFormat,
    ) -> Result<Self> {
        Ok(ResidualUnit {
            act1: SnakeBeta::load(file, &format!("{prefix}.act1"), dim)?,
            conv1: CausalConv1d::load(
                backend,
                file,
                &format!("{prefix}.conv1"),
                (dim, dim, 7),
                dilation,
                format,
            )?,
            act2: SnakeBeta::load(file, &format!("{prefix}.act2"), dim)?,
            conv2: CausalConv1d::load(
                backend,
                file,
                &format!("{prefix}.conv2"),
                (dim, dim, 1),
                1,
                format,
            )?,
        })
    }

    /// In place on `x[dim][len]`.
    fn forward<'m>(&'m self, g: &mut Graph<'m>, state: &'m mut ConvState, x: &Tensor, len: usize) {
        let h = g.duplicate(x);
        self.act1.forward(g, &h, len);
        let h2 = self.conv1.forward(g, state, &h, len);
        drop(h);
        self.act2.forward(g, &h2, len);
        let h3 = self.conv2.forward_pointwise(g, &h2, len);
        drop(h2);
        let n = g.len(x);
        g.strided(Combine::Add, &h3, x, Strided::contiguous(n));
        drop(h3);
    }
}

struct DecoderBlock {
    snake: SnakeBeta,
    upsample: CausalConvTranspose1d,
    units: Vec<ResidualUnit>,
}

impl DecoderBlock {
    fn load(
        backend: &dyn Backend,
        file: &dyn Weights,
        prefix: &str,
        (cin, cout): (usize, usize),
        rate: usize,
        format: WeightFormat,
    ) -> Result<Self> {
        let units = [1, 3, 9]
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                ResidualUnit::load(
                    backend,
                    file,
                    &format!("{prefix}.block.{}", i + 2),
                    cout,
                    d,
                    format,
                )
            })
            .collect::<Result<_>>()?;
        Ok(DecoderBlock {
            snake: SnakeBeta::load(file, &format!("{prefix}.block.0"), cin)?,
            upsample: CausalConvTranspose1d::load(
                backend,
                file,
                &format!("{prefix}.block.1"),
                (cin, cout, 2 * rate),
                rate,
                format,
            )?,
            units,
        })
    }

    fn new_state(&self) -> BlockState {
        BlockState {
            context: self.upsample.new_state(),
            units: self.units.iter().map(|u| u.conv1.new_state()).collect(),
        }
    }

    /// `x[cin][len]` (changed in place) → `(y[cout][len · rate], len · rate)`.
    fn forward<'m>(
        &'m self,
        g: &mut Graph<'m>,
        state: &'m mut BlockState,
        x: &Tensor,
        len: usize,
    ) -> (Tensor, usize) {
        let BlockState { context, units } = state;
        self.snake.forward(g, x, len);
        let y = self.upsample.forward(g, context, x, len);
        let out_len = self.upsample.out_len(len);
        for (unit, unit_state) in self.units.iter().zip(units.iter_mut()) {
            unit.forward(g, unit_state, &y, out_len);
        }
        (y, out_len)
    }
}

#[derive(Clone)]
struct BlockState {
    context: ConvState,
    units: Vec<ConvState>,
}

/// What the vocoder carries between chunks.
#[derive(Clone)]
pub struct VocoderState {
    input_conv: ConvState,
    blocks: Vec<BlockState>,
    output_conv: ConvState,
}

pub struct Vocoder {
    input_conv: CausalConv1d,
    blocks: Vec<DecoderBlock>,
    final_snake: SnakeBeta,
    output_conv: CausalConv1d,
}

impl Vocoder {
    pub fn load(
        backend: &dyn Backend,
        file: &dyn Weights,
        prefix: &str,
        cfg: &DecoderConfig,
        format: WeightFormat,
    ) -> Result<Self> {
        let n = cfg.upsample_rates.len();
        let mut blocks = Vec::with_capacity(n);
        for (i, &rate) in cfg.upsample_rates.iter().enumerate() {
            let (cin, cout) = (cfg.decoder_dim >> i, cfg.block_channels(i));
            blocks.push(DecoderBlock::load(
                backend,
                file,
                &format!("{prefix}.{}", i + 1),
                (cin, cout),
                rate,
                format,
            )?);
        }
        let out_dim = cfg.block_channels(n - 1);
        Ok(Vocoder {
            input_conv: CausalConv1d::load(
                backend,
                file,
                &format!("{prefix}.0"),
                (cfg.latent_dim, cfg.decoder_dim, 7),
                1,
                format,
            )?,
            blocks,
            final_snake: SnakeBeta::load(file, &format!("{prefix}.{}", n + 1), out_dim)?,
            output_conv: CausalConv1d::load(
                backend,
                file,
                &format!("{prefix}.{}", n + 2),
                (out_dim, 1, 7),
                1,
                format,
            )?,
        })
    }

    pub fn new_state(&self) -> VocoderState {
        VocoderState {
            input_conv: self.input_conv.new_state(),
            blocks: self.blocks.iter().map(DecoderBlock::new_state).collect(),
            output_conv: self.output_conv.new_state(),
        }
    }

    /// `x[latent][len]` → the unclamped waveform, continuing after `state`; `trace` sees the output of every
    /// `decoder.decoder.{i}`.
    pub fn forward<'m>(
        &'m self,
        g: &mut Graph<'m>,
        state: &'m mut VocoderState,
        x: &Tensor,
        len: usize,
        trace: &mut Trace<'_>,
    ) -> Tensor {
        let VocoderState {
            input_conv,
            blocks,
            output_conv,
        } = state;
        let mut h = self.input_conv.forward(g, input_conv, x, len);
        trace.show(g, "decoder.0", &h);
        let mut len = len;
        for (i, (block, block_state)) in self.blocks.iter().zip(blocks.iter_mut()).enumerate() {
            let (y, y_len) = block.forward(g, block_state, &h, len);
            drop(h);
            (h, len) = (y, y_len);
            trace.show(g, &format!("decoder.{}", i + 1), &h);
        }
        let n = self.blocks.len();
        self.final_snake.forward(g, &h, len);
        trace.show(g, &format!("decoder.{}", n + 1), &h);
        let wav = self.output_conv.forward(g, output_conv, &h, len);
        drop(h);
        trace.show(g, &format!("decoder.{}", n + 2), &wav);
        wav
    }
}
