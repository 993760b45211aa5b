//! The 12 Hz codec's encoder (`Qwen3TTSTokenizerV2Encoder`, the Mimi encoder of `transformers`): 24 kHz audio
//! → SEANet convolutions (×960, 25 Hz) → an 8-layer causal transformer → a stride-2 convolution (12.5 Hz) →
//! split residual vector quantization, of which the first `encoder_valid_num_quantizers` (16) codes of each
//! frame are kept, trimmed to `ceil(samples / 1920)` frames. A Base model's in-context voice cloning puts these
//! reference codes in its prompt.
//!
//! Mirrors `Qwen3TTSTokenizerV2Encoder` in qwen-tts 0.1.1's
//! `qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`, a subclass of `transformers`' `MimiModel`
//! (transformers 4.57.3, `models/mimi/modeling_mimi.py`).
//!
//! Tensors are `encoder.*` of `speech_tokenizer/model.safetensors` (its codebooks are the encoder's own, not
//! the decoder's). The official encoder's causal mask is the full one (`create_causal_mask`): the configured
//! `sliding_window` does not limit it, and it does not here either. It runs once per reference recording.

use std::path::Path;

use kazeia_backend_abi::{AttentionSpan, Backend, Combine, Heads, Strided, Weight};
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::graph::{Graph, Tensor};
use crate::host_conv::{pad, transpose, Conv1d, Pad};
use crate::linear::upload_f32_linear;
use crate::weights::{WeightFile, Weights};

/// The top-level `speech_tokenizer/config.json` keys the encoder needs.
#[derive(Clone, Debug, Deserialize)]
pub struct EncoderTopConfig {
    #[serde(default = "d::n16")]
    pub encoder_valid_num_quantizers: usize,
    #[serde(default = "d::rate")]
    pub input_sample_rate: u32,
    #[serde(default = "d::n1920")]
    pub encode_downsample_rate: usize,
    pub encoder_config: Option<MimiConfig>,
}

/// `encoder_config` (a `MimiConfig`), with its class defaults.
#[derive(Clone, Debug, Deserialize)]
pub struct MimiConfig {
    #[serde(default = "d::rate")]
    pub sampling_rate: u32,
    #[serde(default = "d::one")]
    pub audio_channels: usize,
    #[serde(default = "d::n512")]
    pub hidden_size: usize,
    #[serde(default = "d::n64")]
    pub num_filters: usize,
    #[serde(default = "d::one")]
    pub num_residual_layers: usize,
    #[serde(default = "d::ratios")]
    pub upsampling_ratios: Vec<usize>,
    #[serde(default = "d::n7")]
    pub kernel_size: usize,
    #[serde(default = "d::n3")]
    pub last_kernel_size: usize,
    #[serde(default = "d::n3")]
    pub residual_kernel_size: usize,
    #[serde(default = "d::n2")]
    pub dilation_growth_rate: usize,
    #[serde(default = "d::yes")]
    pub use_causal_conv: bool,
    #[serde(default = "d::constant")]
    pub pad_mode: String,
    #[serde(default = "d::n2")]
    pub compress: usize,
    #[serde(default)]
    pub use_conv_shortcut: bool,
    #[serde(default = "d::n2048")]
    pub codebook_size: usize,
    #[serde(default = "d::n256")]
    pub codebook_dim: usize,
    #[serde(default = "d::n32")]
    pub num_quantizers: usize,
    #[serde(default = "d::n256")]
    pub vector_quantization_hidden_dimension: usize,
    #[serde(default = "d::one")]
    pub num_semantic_quantizers: usize,
    #[serde(default = "d::n8")]
    pub num_hidden_layers: usize,
    #[serde(default = "d::n2048")]
    pub intermediate_size: usize,
    #[serde(default = "d::n8")]
    pub num_attention_heads: usize,
    #[serde(default = "d::n8")]
    pub num_key_value_heads: usize,
    pub head_dim: Option<usize>,
    #[serde(default = "d::gelu")]
    pub hidden_act: String,
    #[serde(default = "d::eps")]
    pub norm_eps: f64,
    #[serde(default = "d::theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub attention_bias: bool,
    /// The output frame rate (12.5); absent: derived from the strides (with the stride-2 downsample).
    #[serde(default, alias = "_frame_rate")]
    pub frame_rate: Option<f64>,
}

mod d {
    pub fn n16() -> usize {
        16
    }
    pub fn rate() -> u32 {
        24000
    }
    pub fn n1920() -> usize {
        1920
    }
    pub fn one() -> usize {
        1
    }
    pub fn n2() -> usize {
        2
    }
    pub fn n3() -> usize {
        3
    }
    pub fn n7() -> usize {
        7
    }
    pub fn n8() -> usize {
        8
    }
    pub fn n32() -> usize {
        32
    }
    pub fn n64() -> usize {
        64
    }
    pub fn n256() -> usize {
        256
    }
    pub fn n512() -> usize {
        512
    }
    pub fn n2048() -> usize {
        2048
    }
    pub fn ratios() -> Vec<usize> {
        vec![8, 6, 5, 4]
    }
    pub fn yes() -> bool {
        true
    }
    pub fn constant() -> String {
        "constant".into()
    }
    pub fn gelu() -> String {
        "gelu".into()
    }
    pub fn eps() -> f64 {
        1e-5
    }
    pub fn theta() -> f64 {
        10000.0
    }
}

impl MimiConfig {
    fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// The SEANet's frame rate (`ceil(rate / Π ratios)`), before the downsample.
    fn encodec_frame_rate(&self) -> f64 {
        let hop: usize = self.upsampling_ratios.iter().product();
        (self.sampling_rate as f64 / hop as f64).ceil()
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: &str| {
            Err(Error::Input(format!(
                "speech_tokenizer encoder_config: {m}"
            )))
        };
        if self.audio_channels != 1 {
            return bad("only mono encoders are supported");
        }
        if !self.use_causal_conv || self.pad_mode != "constant" {
            return bad("only causal, zero-padded encoders are supported (the released one)");
        }
        if self.use_conv_shortcut {
            return bad("conv shortcuts are not supported (the released encoder has none)");
        }
        if self.hidden_act != "gelu" {
            return bad("only the gelu activation is supported");
        }
        if self.num_attention_heads == 0
            || self.num_key_value_heads == 0
            || !self
                .num_attention_heads
                .is_multiple_of(self.num_key_value_heads)
        {
            return bad("attention heads must be a multiple of kv heads");
        }
        if self.num_semantic_quantizers == 0 || self.num_semantic_quantizers >= self.num_quantizers
        {
            return bad("needs semantic and acoustic quantizers");
        }
        Ok(())
    }
}

/// A `MimiConv1d`: causal, left padding `(k−1)·d + 1 − stride`, right "extra" padding to a whole last frame.
struct MimiConv {
    conv: Conv1d,
    mode: Pad,
}

impl MimiConv {
    #[allow(clippy::too_many_arguments)]
    fn load(
        backend: &dyn Backend,
        file: &dyn Weights,
        prefix: &str,
        shape: (usize, usize, usize),
        stride: usize,
        dilation: usize,
        bias: bool,
        mode: Pad,
    ) -> Result<Self> {
        Ok(MimiConv {
            conv: Conv1d::load(
                backend,
                file,
                &format!("{prefix}.conv"),
                shape,
                stride,
                dilation,
                bias,
            )?,
            mode,
        })
    }

    fn forward(&self, backend: &dyn Backend, x: &[f32], len: usize) -> Result<(Vec<f32>, usize)> {
        let c = &self.conv;
        let k_eff = (c.k - 1) * c.dilation + 1;
        let total = k_eff as i64 - c.stride as i64;
        // `_get_extra_padding_for_conv1d`, in the same float arithmetic.
        let frames =
            ((len as i64 - k_eff as i64 + total) as f64 / c.stride as f64 + 1.0).ceil() as i64 - 1;
        let ideal = frames * c.stride as i64 + k_eff as i64 - total;
        let extra = (ideal - len as i64).max(0) as usize;
        let padded = pad(x, c.cin, len, total.max(0) as usize, extra, self.mode)?;
        c.forward(backend, &padded, len + total.max(0) as usize + extra)
    }
}

fn elu(x: &mut [f32]) {
    for v in x {
        if *v < 0.0 {
            *v = v.exp_m1();
        }
    }
}

struct ResnetBlock {
    conv1: MimiConv,
    conv2: MimiConv,
}

enum SeanetLayer {
    Conv(MimiConv),
    Resnet(ResnetBlock),
    Elu,
}

struct TransformerLayer {
    norm1: (Vec<f32>, Vec<f32>),
    norm2: (Vec<f32>, Vec<f32>),
    q: Weight,
    k: Weight,
    v: Weight,
    o: Weight,
    fc1: Weight,
    fc2: Weight,
    attn_scale: Vec<f32>,
    mlp_scale: Vec<f32>,
}

/// One residual codebook: `embed_sum / max(cluster_usage, 1e-5)`, `[codebook_size][dim]`.
struct Codebook {
    embed: Vec<f32>,
}

struct ResidualQuantizer {
    input_proj: Option<Weight>,
    codebooks: Vec<Codebook>,
}

pub struct CodecEncoder {
    config: MimiConfig,
    top: EncoderTopConfig,
    seanet: Vec<SeanetLayer>,
    transformer: Vec<TransformerLayer>,
    downsample: Option<MimiConv>,
    semantic: ResidualQuantizer,
    acoustic: ResidualQuantizer,
}

/// Intermediate results of one encode, for parity tests: `[channels][len]` each.
#[derive(Default)]
pub struct EncoderStages {
    pub seanet: Vec<f32>,
    pub transformer: Vec<f32>,
    pub downsample: Vec<f32>,
}

impl CodecEncoder {
    /// Loads the encoder of `speech_tokenizer/` in a model directory (or of that directory itself).
    pub fn load(dir: &Path, backend: &dyn Backend) -> Result<Self> {
        let dir = if dir.join("speech_tokenizer").is_dir() {
            dir.join("speech_tokenizer")
        } else {
            dir.to_owned()
        };
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let top: EncoderTopConfig = serde_json::from_str(&text).map_err(|e| Error::Config {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let file = WeightFile::open(&dir.join("model.safetensors"))?;
        Self::from_parts(top, &file, backend)
    }

    pub fn from_parts(
        top: EncoderTopConfig,
        file: &dyn Weights,
        backend: &dyn Backend,
    ) -> Result<Self> {
        let config = top.encoder_config.clone().ok_or_else(|| {
            Error::Input(
                "this speech tokenizer has no encoder_config: it cannot encode reference audio"
                    .into(),
            )
        })?;
        config.validate()?;
        let c = &config;
        let p = "encoder.encoder.layers";
        let mut seanet = Vec::new();
        let mut idx = 0;
        let conv = |seanet: &mut Vec<SeanetLayer>, idx: &mut usize, shape, stride| -> Result<()> {
            seanet.push(SeanetLayer::Conv(MimiConv::load(
                backend,
                file,
                &format!("{p}.{idx}"),
                shape,
                stride,
                1,
                true,
                Pad::Zeros,
            )?));
            *idx += 1;
            Ok(())
        };
        conv(
            &mut seanet,
            &mut idx,
            (c.audio_channels, c.num_filters, c.kernel_size),
            1,
        )?;
        let mut scaling = 1;
        for &ratio in c.upsampling_ratios.iter().rev() {
            let dim = scaling * c.num_filters;
            for j in 0..c.num_residual_layers {
                let hidden = dim / c.compress;
                let dilation = c.dilation_growth_rate.pow(j as u32);
                let block = |i: usize, shape, d| {
                    MimiConv::load(
                        backend,
                        file,
                        &format!("{p}.{idx}.block.{i}"),
                        shape,
                        1,
                        d,
                        true,
                        Pad::Zeros,
                    )
                };
                seanet.push(SeanetLayer::Resnet(ResnetBlock {
                    conv1: block(1, (dim, hidden, c.residual_kernel_size), dilation)?,
                    conv2: block(3, (hidden, dim, 1), 1)?,
                }));
                idx += 1;
            }
            seanet.push(SeanetLayer::Elu);
            idx += 1;
            conv(&mut seanet, &mut idx, (dim, dim * 2, ratio * 2), ratio)?;
            scaling *= 2;
        }
        seanet.push(SeanetLayer::Elu);
        idx += 1;
        conv(
            &mut seanet,
            &mut idx,
            (scaling * c.num_filters, c.hidden_size, c.last_kernel_size),
            1,
        )?;

        let h = c.hidden_size;
        let hd = c.head_dim();
        let (qh, kvh) = (c.num_attention_heads, c.num_key_value_heads);
        let linear = |name: &str, out: usize, inp: usize| -> Result<Weight> {
            let w = file.tensor_shaped(name, &[out, inp])?;
            upload_f32_linear(backend, &w, out, inp, None)
        };
        let vec = |name: &str| file.tensor_shaped(name, &[h]);
        let transformer = (0..c.num_hidden_layers)
            .map(|i| {
                let l = format!("encoder.encoder_transformer.layers.{i}");
                Ok(TransformerLayer {
                    norm1: (
                        vec(&format!("{l}.input_layernorm.weight"))?,
                        vec(&format!("{l}.input_layernorm.bias"))?,
                    ),
                    norm2: (
                        vec(&format!("{l}.post_attention_layernorm.weight"))?,
                        vec(&format!("{l}.post_attention_layernorm.bias"))?,
                    ),
                    q: linear(&format!("{l}.self_attn.q_proj.weight"), qh * hd, h)?,
                    k: linear(&format!("{l}.self_attn.k_proj.weight"), kvh * hd, h)?,
                    v: linear(&format!("{l}.self_attn.v_proj.weight"), kvh * hd, h)?,
                    o: linear(&format!("{l}.self_attn.o_proj.weight"), h, qh * hd)?,
                    fc1: linear(&format!("{l}.mlp.fc1.weight"), c.intermediate_size, h)?,
                    fc2: linear(&format!("{l}.mlp.fc2.weight"), h, c.intermediate_size)?,
                    attn_scale: vec(&format!("{l}.self_attn_layer_scale.scale"))?,
                    mlp_scale: vec(&format!("{l}.mlp_layer_scale.scale"))?,
                })
            })
            .collect::<Result<_>>()?;
        if c.attention_bias {
            return Err(Error::Input(
                "encoder attention biases are not supported".into(),
            ));
        }

        let rate = c.frame_rate.unwrap_or(c.encodec_frame_rate() / 2.0);
        let downsample = if (rate - c.encodec_frame_rate()).abs() > 1e-9 {
            let k = 2 * (c.encodec_frame_rate() / rate) as usize;
            Some(MimiConv::load(
                backend,
                file,
                "encoder.downsample",
                (h, h, k),
                2,
                1,
                false,
                Pad::Replicate,
            )?)
        } else {
            None
        };

        let rvq = |name: &str, count: usize| -> Result<ResidualQuantizer> {
            let q = format!("encoder.quantizer.{name}");
            let vq = c.vector_quantization_hidden_dimension;
            if vq != c.codebook_dim {
                return Err(Error::Input(format!(
                    "encoder_config: codebook_dim {} ≠ vector_quantization_hidden_dimension {vq}",
                    c.codebook_dim
                )));
            }
            let input_proj = if vq != h {
                let w = file.tensor_shaped(&format!("{q}.input_proj.weight"), &[vq, h, 1])?;
                Some(upload_f32_linear(backend, &w, vq, h, None)?)
            } else {
                None
            };
            let codebooks = (0..count)
                .map(|i| {
                    let cb = format!("{q}.layers.{i}.codebook");
                    let sum = file.tensor_shaped(
                        &format!("{cb}.embed_sum"),
                        &[c.codebook_size, c.codebook_dim],
                    )?;
                    let usage =
                        file.tensor_shaped(&format!("{cb}.cluster_usage"), &[c.codebook_size])?;
                    let embed = sum
                        .chunks_exact(c.codebook_dim)
                        .zip(&usage)
                        .flat_map(|(row, u)| {
                            let u = u.max(1e-5);
                            row.iter().map(move |v| v / u)
                        })
                        .collect();
                    Ok(Codebook { embed })
                })
                .collect::<Result<_>>()?;
            Ok(ResidualQuantizer {
                input_proj,
                codebooks,
            })
        };
        let keep = top.encoder_valid_num_quantizers.min(c.num_quantizers);
        if keep <= c.num_semantic_quantizers {
            return Err(Error::Input(
                "encoder_valid_num_quantizers leaves no acoustic codebook".into(),
            ));
        }
        let semantic = rvq(
            "semantic_residual_vector_quantizer",
            c.num_semantic_quantizers,
        )?;
        let acoustic = rvq(
            "acoustic_residual_vector_quantizer",
            keep - c.num_semantic_quantizers,
        )?;
        Ok(CodecEncoder {
            config,
            top,
            seanet,
            transformer,
            downsample,
            semantic,
            acoustic,
        })
    }

    pub fn sample_rate(&self) -> u32 {
        self.top.input_sample_rate
    }

    /// Codes per frame (the encoder's valid quantizers).
    pub fn codebooks(&self) -> usize {
        self.semantic.codebooks.len() + self.acoustic.codebooks.len()
    }

    /// Reference codes of 24 kHz mono audio, `[frame][codebook]`, `ceil(samples / 1920)` frames.
    pub fn encode(&self, backend: &dyn Backend, wav: &[f32]) -> Result<Vec<Vec<u32>>> {
        self.encode_staged(backend, wav, None)
    }

    /// [`CodecEncoder::encode`], keeping the intermediate results in `stages`.
    pub fn encode_staged(
        &self,
        backend: &dyn Backend,
        wav: &[f32],
        mut stages: Option<&mut EncoderStages>,
    ) -> Result<Vec<Vec<u32>>> {
        if wav.is_empty() {
            return Err(Error::Input("the audio is empty".into()));
        }
        let c = &self.config;
        let mut x = wav.to_vec();
        let mut len = wav.len();
        for layer in &self.seanet {
            match layer {
                SeanetLayer::Elu => elu(&mut x),
                SeanetLayer::Conv(conv) => (x, len) = conv.forward(backend, &x, len)?,
                SeanetLayer::Resnet(block) => {
                    let mut h = x.clone();
                    elu(&mut h);
                    let (mut h, l1) = block.conv1.forward(backend, &h, len)?;
                    elu(&mut h);
                    let (h, l2) = block.conv2.forward(backend, &h, l1)?;
                    if l2 != len {
                        return Err(Error::Input("residual block changed the length".into()));
                    }
                    x.iter_mut().zip(&h).for_each(|(a, b)| *a += b);
                }
            }
        }
        if let Some(s) = stages.as_deref_mut() {
            s.seanet = x.clone();
        }
        // Transformer on `[len][hidden]` rows.
        let h = c.hidden_size;
        let mut rows = transpose(&x, h, len);
        self.transformer_forward(backend, &mut rows, len)?;
        let mut x = transpose(&rows, len, h);
        if let Some(s) = stages.as_deref_mut() {
            s.transformer = x.clone();
        }
        if let Some(down) = &self.downsample {
            (x, len) = down.forward(backend, &x, len)?;
        }
        if let Some(s) = stages {
            s.downsample = x.clone();
        }
        let rows = transpose(&x, h, len);
        let semantic = self.semantic.encode(backend, &rows, len, c.codebook_dim)?;
        let acoustic = self.acoustic.encode(backend, &rows, len, c.codebook_dim)?;
        let frames = wav.len().div_ceil(self.top.encode_downsample_rate).min(len);
        Ok((0..frames)
            .map(|t| semantic[t].iter().chain(&acoustic[t]).copied().collect())
            .collect())
    }

    /// The transformer on `x[len][hidden]`, in place, as one graph on `backend`.
    fn transformer_forward(&self, backend: &dyn Backend, x: &mut [f32], len: usize) -> Result<()> {
        let c = &self.config;
        let h = c.hidden_size;
        let hd = c.head_dim();
        let (qh, kvh) = (c.num_attention_heads, c.num_key_value_heads);
        let eps = c.norm_eps as f32;
        let theta = c.rope_theta as f32;
        let mut g = Graph::new(backend);
        let xs = g.input(x.to_vec());
        for layer in &self.transformer {
            let n = g.duplicate(&xs);
            g.layer_norm(&n, h, &layer.norm1.0, &layer.norm1.1, eps);
            let q = g.linear(&layer.q, &n, len, qh * hd);
            let k = g.linear(&layer.k, &n, len, kvh * hd);
            let v = g.linear(&layer.v, &n, len, kvh * hd);
            drop(n);
            g.rope(&q, qh, hd, 0, theta);
            g.rope(&k, kvh, hd, 0, theta);
            let span = AttentionSpan {
                queries: len,
                query_start: 0,
                keys: len,
                key_start: 0,
                window: None,
            };
            let heads = Heads {
                q_heads: qh,
                kv_heads: kvh,
                head_dim: hd,
            };
            let att = g.attention(&q, &k, &v, heads, span, 1.0 / (hd as f32).sqrt());
            for t in [q, k, v] {
                drop(t);
            }
            let o = g.linear(&layer.o, &att, len, h);
            drop(att);
            add_scaled(&mut g, &xs, o, len, &layer.attn_scale);
            let n = g.duplicate(&xs);
            g.layer_norm(&n, h, &layer.norm2.0, &layer.norm2.1, eps);
            let m = g.linear(&layer.fc1, &n, len, c.intermediate_size);
            drop(n);
            g.gelu(&m);
            let o = g.linear(&layer.fc2, &m, len, h);
            drop(m);
            add_scaled(&mut g, &xs, o, len, &layer.mlp_scale);
        }
        x.copy_from_slice(&g.take(xs)?);
        g.finish()
    }
}

/// `x += scale ⊙ y` on `[rows][scale.len()]` (LayerScale residuals); `y` is released.
fn add_scaled<'m>(g: &mut Graph<'m>, x: &Tensor, y: Tensor, rows: usize, scale: &'m [f32]) {
    g.scale_columns(&y, rows, scale);
    let len = g.len(&y);
    g.strided(Combine::Add, &y, x, Strided::contiguous(len));
    drop(y);
}

impl ResidualQuantizer {
    /// Codes of `rows[len][hidden]`: projected, then each codebook takes the nearest entry of the residual.
    fn encode(
        &self,
        backend: &dyn Backend,
        rows: &[f32],
        len: usize,
        dim: usize,
    ) -> Result<Vec<Vec<u32>>> {
        let mut residual = match &self.input_proj {
            Some(w) => {
                let mut g = Graph::new(backend);
                let x = g.input(rows.to_vec());
                let y = g.linear(w, &x, len, dim);
                g.take(y)?
            }
            None => rows.to_vec(),
        };
        let mut codes = vec![Vec::with_capacity(self.codebooks.len()); len];
        for cb in &self.codebooks {
            for (t, r) in residual.chunks_exact_mut(dim).enumerate() {
                let best = nearest(&cb.embed, dim, r);
                codes[t].push(best as u32);
                for (a, e) in r.iter_mut().zip(&cb.embed[best * dim..(best + 1) * dim]) {
                    *a -= e;
                }
            }
        }
        Ok(codes)
    }
}

/// The index of the codebook row nearest to `x` (Euclidean; the first on a tie, as `argmin`).
fn nearest(embed: &[f32], dim: usize, x: &[f32]) -> usize {
    let mut best = (f64::INFINITY, 0);
    for (i, row) in embed.chunks_exact(dim).enumerate() {
        let d: f64 = row
            .iter()
            .zip(x)
            .map(|(e, v)| {
                let diff = *v as f64 - *e as f64;
                diff * diff
            })
            .sum();
        if d < best.0 {
            best = (d, i);
        }
    }
    best.1
}
