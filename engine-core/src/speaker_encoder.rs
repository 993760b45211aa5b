//! The Base models' speaker encoder (`Qwen3TTSSpeakerEncoder`, an ECAPA-TDNN): 24 kHz audio → log-mel
//! ([`crate::mel`]) → TDNN → three SE-Res2Net blocks → multi-layer aggregation → attentive statistics pooling
//! → a talker-wide x-vector, which a Base model's prompt carries in the speaker slot.
//!
//! Mirrors `Qwen3TTSSpeakerEncoder` in qwen-tts 0.1.1's `qwen_tts/core/models/modeling_qwen3_tts.py`.
//!
//! Every convolution has `padding="same"` with reflect padding; tensors are the released `speaker_encoder.*`
//! of `model.safetensors`. It runs once per reference recording.

use kazeia_backend_abi::Backend;
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::host_conv::{pad, Conv1d, Pad};
use crate::mel::{MelSpectrogram, N_MELS};
use crate::weights::Weights;

/// `speaker_encoder_config` of a Base model's `config.json` (the released values as defaults).
#[derive(Clone, Debug, Deserialize)]
pub struct SpeakerEncoderConfig {
    #[serde(default = "d::mel_dim")]
    pub mel_dim: usize,
    #[serde(default = "d::enc_dim")]
    pub enc_dim: usize,
    #[serde(default = "d::channels")]
    pub enc_channels: Vec<usize>,
    #[serde(default = "d::kernels")]
    pub enc_kernel_sizes: Vec<usize>,
    #[serde(default = "d::dilations")]
    pub enc_dilations: Vec<usize>,
    #[serde(default = "d::c128")]
    pub enc_attention_channels: usize,
    #[serde(default = "d::scale")]
    pub enc_res2net_scale: usize,
    #[serde(default = "d::c128")]
    pub enc_se_channels: usize,
    #[serde(default = "d::rate")]
    pub sample_rate: u32,
}

mod d {
    pub fn mel_dim() -> usize {
        128
    }
    pub fn enc_dim() -> usize {
        1024
    }
    pub fn channels() -> Vec<usize> {
        vec![512, 512, 512, 512, 1536]
    }
    pub fn kernels() -> Vec<usize> {
        vec![5, 3, 3, 3, 1]
    }
    pub fn dilations() -> Vec<usize> {
        vec![1, 2, 3, 4, 1]
    }
    pub fn c128() -> usize {
        128
    }
    pub fn scale() -> usize {
        8
    }
    pub fn rate() -> u32 {
        24000
    }
}

impl SpeakerEncoderConfig {
    fn validate(&self) -> Result<()> {
        let n = self.enc_channels.len();
        let bad = |m: String| Err(Error::Input(format!("speaker_encoder_config: {m}")));
        if n < 3 || self.enc_kernel_sizes.len() != n || self.enc_dilations.len() != n {
            return bad(
                "enc_channels, enc_kernel_sizes and enc_dilations need the same length (≥ 3)"
                    .into(),
            );
        }
        if self.mel_dim != N_MELS || self.sample_rate != crate::mel::SAMPLE_RATE {
            return bad(format!(
                "only {N_MELS} mel bins of {} Hz audio are supported",
                crate::mel::SAMPLE_RATE
            ));
        }
        if self.enc_channels[n - 1] != self.enc_channels[1..n - 1].iter().sum::<usize>() {
            return bad("the last channel count must be the sum of the SE-Res2Net blocks'".into());
        }
        let scale = self.enc_res2net_scale;
        if scale < 2 || self.enc_channels[1..n - 1].iter().any(|c| c % scale != 0) {
            return bad(format!("channels must divide by the Res2Net scale {scale}"));
        }
        Ok(())
    }
}

/// A `TimeDelayNetBlock`: same-padded (reflect) convolution then ReLU.
struct Tdnn {
    conv: Conv1d,
}

impl Tdnn {
    fn load(
        backend: &dyn Backend,
        file: &dyn Weights,
        prefix: &str,
        shape: (usize, usize, usize),
        dilation: usize,
    ) -> Result<Self> {
        Ok(Tdnn {
            conv: Conv1d::load(
                backend,
                file,
                &format!("{prefix}.conv"),
                shape,
                1,
                dilation,
                true,
            )?,
        })
    }

    fn forward(&self, backend: &dyn Backend, x: &[f32], len: usize) -> Result<Vec<f32>> {
        let mut y = same_conv(&self.conv, backend, x, len)?;
        y.iter_mut().for_each(|v| *v = v.max(0.0));
        Ok(y)
    }
}

/// `padding="same"`, `padding_mode="reflect"` (odd kernels: the same on both sides).
fn same_conv(conv: &Conv1d, backend: &dyn Backend, x: &[f32], len: usize) -> Result<Vec<f32>> {
    let total = (conv.k - 1) * conv.dilation;
    let (left, right) = (total / 2, total - total / 2);
    if total == 0 {
        return Ok(conv.forward(backend, x, len)?.0);
    }
    let padded = pad(x, conv.cin, len, left, right, Pad::Reflect)?;
    Ok(conv.forward(backend, &padded, len + total)?.0)
}

struct SeRes2NetBlock {
    tdnn1: Tdnn,
    res2net: Vec<Tdnn>,
    scale: usize,
    tdnn2: Tdnn,
    se1: Conv1d,
    se2: Conv1d,
    channels: usize,
}

impl SeRes2NetBlock {
    fn forward(&self, backend: &dyn Backend, x: &[f32], len: usize) -> Result<Vec<f32>> {
        let c = self.channels;
        let h = self.tdnn1.forward(backend, x, len)?;
        // Res2Net: chunk 0 as is, chunk 1 through its TDNN, chunk i through its TDNN after adding output i−1.
        let part = c / self.scale;
        let mut out = Vec::with_capacity(c * len);
        let mut previous: Vec<f32> = Vec::new();
        for i in 0..self.scale {
            let chunk = &h[i * part * len..(i + 1) * part * len];
            let y = match i {
                0 => chunk.to_vec(),
                1 => self.res2net[0].forward(backend, chunk, len)?,
                _ => {
                    let sum: Vec<f32> = chunk.iter().zip(&previous).map(|(a, b)| a + b).collect();
                    self.res2net[i - 1].forward(backend, &sum, len)?
                }
            };
            out.extend_from_slice(&y);
            previous = y;
        }
        let mut h = self.tdnn2.forward(backend, &out, len)?;
        // Squeeze-excitation: channel means → 1×1 conv, ReLU → 1×1 conv, sigmoid → channel scales.
        let means: Vec<f32> = h.chunks_exact(len).map(mean).collect();
        let mut s = self.se1.forward(backend, &means, 1)?.0;
        s.iter_mut().for_each(|v| *v = v.max(0.0));
        let gates = self.se2.forward(backend, &s, 1)?.0;
        for ((row, g), res) in h.chunks_exact_mut(len).zip(&gates).zip(x.chunks_exact(len)) {
            let g = 1.0 / (1.0 + (-g).exp());
            for (v, r) in row.iter_mut().zip(res) {
                *v = *v * g + r;
            }
        }
        Ok(h)
    }
}

fn mean(x: &[f32]) -> f32 {
    x.iter().sum::<f32>() / x.len() as f32
}

pub struct SpeakerEncoder {
    pub config: SpeakerEncoderConfig,
    first: Tdnn,
    blocks: Vec<SeRes2NetBlock>,
    mfa: Tdnn,
    asp_tdnn: Tdnn,
    asp_conv: Conv1d,
    fc: Conv1d,
    mel: MelSpectrogram,
}

impl SpeakerEncoder {
    /// `speaker_encoder.*` of a Base model's checkpoint.
    pub fn load(
        backend: &dyn Backend,
        file: &dyn Weights,
        config: SpeakerEncoderConfig,
    ) -> Result<Self> {
        config.validate()?;
        let ch = &config.enc_channels;
        let ks = &config.enc_kernel_sizes;
        let ds = &config.enc_dilations;
        let n = ch.len();
        let p = "speaker_encoder";
        let first = Tdnn::load(
            backend,
            file,
            &format!("{p}.blocks.0"),
            (config.mel_dim, ch[0], ks[0]),
            ds[0],
        )?;
        let mut blocks = Vec::new();
        for i in 1..n - 1 {
            let b = format!("{p}.blocks.{i}");
            let (cin, c) = (ch[i - 1], ch[i]);
            let part = c / config.enc_res2net_scale;
            let res2net = (0..config.enc_res2net_scale - 1)
                .map(|j| {
                    Tdnn::load(
                        backend,
                        file,
                        &format!("{b}.res2net_block.blocks.{j}"),
                        (part, part, ks[i]),
                        ds[i],
                    )
                })
                .collect::<Result<_>>()?;
            let se = config.enc_se_channels;
            blocks.push(SeRes2NetBlock {
                tdnn1: Tdnn::load(backend, file, &format!("{b}.tdnn1"), (cin, c, 1), 1)?,
                res2net,
                scale: config.enc_res2net_scale,
                tdnn2: Tdnn::load(backend, file, &format!("{b}.tdnn2"), (c, c, 1), 1)?,
                se1: Conv1d::load(
                    backend,
                    file,
                    &format!("{b}.se_block.conv1"),
                    (c, se, 1),
                    1,
                    1,
                    true,
                )?,
                se2: Conv1d::load(
                    backend,
                    file,
                    &format!("{b}.se_block.conv2"),
                    (se, c, 1),
                    1,
                    1,
                    true,
                )?,
                channels: c,
            });
        }
        let last = ch[n - 1];
        let att = config.enc_attention_channels;
        Ok(SpeakerEncoder {
            mfa: Tdnn::load(
                backend,
                file,
                &format!("{p}.mfa"),
                (last, last, ks[n - 1]),
                ds[n - 1],
            )?,
            asp_tdnn: Tdnn::load(
                backend,
                file,
                &format!("{p}.asp.tdnn"),
                (3 * last, att, 1),
                1,
            )?,
            asp_conv: Conv1d::load(
                backend,
                file,
                &format!("{p}.asp.conv"),
                (att, last, 1),
                1,
                1,
                true,
            )?,
            fc: Conv1d::load(
                backend,
                file,
                &format!("{p}.fc"),
                (2 * last, config.enc_dim, 1),
                1,
                1,
                true,
            )?,
            first,
            blocks,
            mel: MelSpectrogram::new(),
            config,
        })
    }

    /// The log-mel frames of 24 kHz audio, `[frames][128]`.
    pub fn mel(&self, wav: &[f32]) -> Result<Vec<f32>> {
        self.mel.compute(wav)
    }

    /// The x-vector of 24 kHz audio.
    pub fn embed(&self, backend: &dyn Backend, wav: &[f32]) -> Result<Vec<f32>> {
        let mel = self.mel(wav)?;
        self.embed_mel(backend, &mel)
    }

    /// The x-vector of log-mel frames `[frames][128]`.
    pub fn embed_mel(&self, backend: &dyn Backend, mel: &[f32]) -> Result<Vec<f32>> {
        let len = mel.len() / N_MELS;
        if len < 2 {
            return Err(Error::Input(
                "the audio is too short for a speaker embedding".into(),
            ));
        }
        let x = crate::host_conv::transpose(mel, len, N_MELS);
        let mut h = self.first.forward(backend, &x, len)?;
        let mut outputs = Vec::new();
        for block in &self.blocks {
            h = block.forward(backend, &h, len)?;
            outputs.extend_from_slice(&h);
        }
        let h = self.mfa.forward(backend, &outputs, len)?;
        let pooled = self.pool(backend, &h, len)?;
        Ok(self.fc.forward(backend, &pooled, 1)?.0)
    }

    /// Attentive statistics pooling: `[channels][len]` → `[2·channels]` (weighted mean, then std).
    fn pool(&self, backend: &dyn Backend, x: &[f32], len: usize) -> Result<Vec<f32>> {
        const EPS: f32 = 1e-12;
        let c = x.len() / len;
        let uniform = vec![1.0 / len as f32; len];
        let stats = |weights: &[f32], row: &[f32]| -> (f32, f32) {
            let m: f32 = row.iter().zip(weights).map(|(v, w)| w * v).sum();
            let var: f32 = row
                .iter()
                .zip(weights)
                .map(|(v, w)| w * (v - m) * (v - m))
                .sum();
            (m, var.max(EPS).sqrt())
        };
        let mut context = x.to_vec();
        let global: Vec<(f32, f32)> = x
            .chunks_exact(len)
            .map(|row| stats(&uniform, row))
            .collect();
        context.extend(
            global
                .iter()
                .flat_map(|&(m, _)| std::iter::repeat_n(m, len)),
        );
        context.extend(
            global
                .iter()
                .flat_map(|&(_, s)| std::iter::repeat_n(s, len)),
        );
        let mut a = self.asp_tdnn.forward(backend, &context, len)?;
        a.iter_mut().for_each(|v| *v = v.tanh());
        let mut scores = self.asp_conv.forward(backend, &a, len)?.0;
        let mut pooled = vec![0.0; 2 * c];
        for (ch, (row, s)) in x
            .chunks_exact(len)
            .zip(scores.chunks_exact_mut(len))
            .enumerate()
        {
            softmax(s);
            let (m, sd) = stats(s, row);
            pooled[ch] = m;
            pooled[c + ch] = sd;
        }
        Ok(pooled)
    }
}

fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    x.iter_mut().for_each(|v| *v /= sum);
}
