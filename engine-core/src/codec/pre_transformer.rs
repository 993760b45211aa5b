//! The codec's pre-transformer: `input_proj` → N pre-norm layers (RoPE attention over a causal sliding window,
//! SwiGLU MLP, each residual branch scaled per channel by LayerScale) → final RMSNorm → `output_proj`.
//!
//! Mirrors `Qwen3TTSTokenizerV2DecoderTransformerModel` (`Qwen3TTSTokenizerV2DecoderTransformerLayer`,
//! `…DecoderAttention`, `…DecoderMlp`, `…DecoderRMSNorm`, `…DecoderLayerScale`, `…DecoderRotatoryEmbedding`)
//! in qwen-tts 0.1.1's `qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`.

use kazeia_backend_abi::{
    AttentionSpan, Backend, Combine, Heads, Strided, View, Weight, WeightFormat,
};

use super::config::DecoderConfig;
use crate::error::Result;
use crate::graph::{Graph, Tensor};
use crate::linear::{load_linear, WeightStorage};
use crate::weights::Weights;

struct Layer {
    input_norm: Vec<f32>,
    post_attention_norm: Vec<f32>,
    q_proj: Weight,
    k_proj: Weight,
    v_proj: Weight,
    o_proj: Weight,
    attn_scale: Vec<f32>,
    gate_proj: Weight,
    up_proj: Weight,
    down_proj: Weight,
    mlp_scale: Vec<f32>,
}

/// Keys and values of the positions a new chunk can still attend to, per layer, with positions continuing
/// across chunks. With a sliding window of `w` only the last `w − 1` positions are kept.
#[derive(Clone)]
pub struct PreTransformerState {
    /// Per layer `[rows][kv_heads · head_dim]`: the first `next − first` rows are the kept keys (the buffer
    /// keeps its size once the window is full, so a device replays the same recorded stage).
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    /// Absolute position of the first kept key.
    first: usize,
    /// Absolute position of the next new frame.
    next: usize,
}

pub struct PreTransformer {
    input_proj: Weight,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    output_proj: Weight,
    latent: usize,
    hidden: usize,
    intermediate: usize,
    heads: Heads,
    window: Option<usize>,
    rope_theta: f32,
    eps: f32,
}

fn linear(
    backend: &dyn Backend,
    file: &dyn Weights,
    name: &str,
    dims: (usize, usize),
    bias: bool,
    format: WeightFormat,
) -> Result<Weight> {
    load_linear(
        backend,
        file,
        name,
        dims,
        bias,
        WeightStorage::Convert(format),
    )
}

impl PreTransformer {
    pub fn load(
        backend: &dyn Backend,
        file: &dyn Weights,
        prefix: &str,
        cfg: &DecoderConfig,
        format: WeightFormat,
    ) -> Result<Self> {
        let linear =
            |backend, file, name: &str, dims, bias| linear(backend, file, name, dims, bias, format);
        let (h, lat, inter) = (cfg.hidden_size, cfg.latent_dim, cfg.intermediate_size);
        let heads = Heads {
            q_heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim(),
        };
        let (q_out, kv_out) = (
            heads.q_heads * heads.head_dim,
            heads.kv_heads * heads.head_dim,
        );
        let bias = cfg.attention_bias;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("{prefix}.layers.{i}");
            layers.push(Layer {
                input_norm: file.tensor_shaped(&format!("{p}.input_layernorm.weight"), &[h])?,
                post_attention_norm: file
                    .tensor_shaped(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                q_proj: linear(
                    backend,
                    file,
                    &format!("{p}.self_attn.q_proj"),
                    (q_out, h),
                    bias,
                )?,
                k_proj: linear(
                    backend,
                    file,
                    &format!("{p}.self_attn.k_proj"),
                    (kv_out, h),
                    bias,
                )?,
                v_proj: linear(
                    backend,
                    file,
                    &format!("{p}.self_attn.v_proj"),
                    (kv_out, h),
                    bias,
                )?,
                o_proj: linear(
                    backend,
                    file,
                    &format!("{p}.self_attn.o_proj"),
                    (h, q_out),
                    bias,
                )?,
                attn_scale: file
                    .tensor_shaped(&format!("{p}.self_attn_layer_scale.scale"), &[h])?,
                gate_proj: linear(
                    backend,
                    file,
                    &format!("{p}.mlp.gate_proj"),
                    (inter, h),
                    false,
                )?,
                up_proj: linear(
                    backend,
                    file,
                    &format!("{p}.mlp.up_proj"),
                    (inter, h),
                    false,
                )?,
                down_proj: linear(
                    backend,
                    file,
                    &format!("{p}.mlp.down_proj"),
                    (h, inter),
                    false,
                )?,
                mlp_scale: file.tensor_shaped(&format!("{p}.mlp_layer_scale.scale"), &[h])?,
            });
        }
        Ok(PreTransformer {
            input_proj: linear(
                backend,
                file,
                &format!("{prefix}.input_proj"),
                (h, lat),
                true,
            )?,
            layers,
            norm: file.tensor_shaped(&format!("{prefix}.norm.weight"), &[h])?,
            output_proj: linear(
                backend,
                file,
                &format!("{prefix}.output_proj"),
                (lat, h),
                true,
            )?,
            latent: lat,
            hidden: h,
            intermediate: inter,
            heads,
            window: cfg.sliding_window,
            rope_theta: cfg.rope_theta as f32,
            eps: cfg.rms_norm_eps as f32,
        })
    }

    pub fn new_state(&self) -> PreTransformerState {
        PreTransformerState {
            keys: vec![Vec::new(); self.layers.len()],
            values: vec![Vec::new(); self.layers.len()],
            first: 0,
            next: 0,
        }
    }

    /// `x[frames][latent]` → `y[frames][latent]`, at the positions following `state`'s.
    pub fn forward<'m>(
        &'m self,
        g: &mut Graph<'m>,
        state: &'m mut PreTransformerState,
        x: &Tensor,
        frames: usize,
    ) -> Tensor {
        let (h, heads) = (self.hidden, self.heads);
        let (q_out, kv_out) = (
            heads.q_heads * heads.head_dim,
            heads.kv_heads * heads.head_dim,
        );
        let PreTransformerState {
            keys,
            values,
            first,
            next,
        } = state;
        let start = *next;
        let kept = start - *first;
        let seen = kept + frames;
        // The next query (position `start + frames`) sees keys down to `start + frames − w + 1`.
        let keep = self.window.map_or(seen, |w| seen.min(w - 1));
        let span = AttentionSpan {
            queries: frames,
            query_start: start,
            keys: seen,
            key_start: *first,
            window: self.window,
        };
        *next = start + frames;
        *first = *next - keep;
        let rows = |offset: usize, n: usize| Strided {
            rows: 1,
            cols: n * kv_out,
            src: View::rows(offset * kv_out, n * kv_out),
            dst: View::rows(0, n * kv_out),
        };
        let scale = 1.0 / (heads.head_dim as f32).sqrt();

        let hidden = g.linear(&self.input_proj, x, frames, h);
        for ((layer, layer_keys), layer_values) in self
            .layers
            .iter()
            .zip(keys.iter_mut())
            .zip(values.iter_mut())
        {
            let normed = g.duplicate(&hidden);
            g.rms_norm(&normed, h, &layer.input_norm, self.eps);
            let q = g.linear(&layer.q_proj, &normed, frames, q_out);
            let k = g.linear(&layer.k_proj, &normed, frames, kv_out);
            let v = g.linear(&layer.v_proj, &normed, frames, kv_out);
            drop(normed);
            g.rope(&q, heads.q_heads, heads.head_dim, start, self.rope_theta);
            g.rope(&k, heads.kv_heads, heads.head_dim, start, self.rope_theta);
            // The kept window then the new keys; the window's new tail goes back to the state.
            let mut window_of = |cache: &'m mut Vec<f32>, new: Tensor| {
                let rows_needed = kept.max(keep) * kv_out;
                if cache.len() < rows_needed {
                    cache.resize(rows_needed, 0.0);
                }
                let cache = g.state(cache);
                let all = g.zeros(seen * kv_out);
                g.strided(Combine::Copy, &cache, &all, rows(0, kept));
                let mut tail = rows(0, frames);
                tail.dst.offset = kept * kv_out;
                g.strided(Combine::Copy, &new, &all, tail);
                drop(new);
                g.strided(Combine::Copy, &all, &cache, rows(seen - keep, keep));
                all
            };
            let all_keys = window_of(layer_keys, k);
            let all_values = window_of(layer_values, v);
            let attn = g.attention(&q, &all_keys, &all_values, heads, span, scale);
            drop(q);
            drop(all_keys);
            drop(all_values);
            let branch = g.linear(&layer.o_proj, &attn, frames, h);
            drop(attn);
            add_scaled(g, &hidden, branch, &layer.attn_scale, frames);

            let normed = g.duplicate(&hidden);
            g.rms_norm(&normed, h, &layer.post_attention_norm, self.eps);
            let gate = g.linear(&layer.gate_proj, &normed, frames, self.intermediate);
            let up = g.linear(&layer.up_proj, &normed, frames, self.intermediate);
            drop(normed);
            g.silu_mul(&gate, &up);
            drop(up);
            let branch = g.linear(&layer.down_proj, &gate, frames, h);
            drop(gate);
            add_scaled(g, &hidden, branch, &layer.mlp_scale, frames);
        }
        g.rms_norm(&hidden, h, &self.norm, self.eps);
        let out = g.linear(&self.output_proj, &hidden, frames, self.latent);
        drop(hidden);
        out
    }
}

/// `hidden += scale ⊙ branch`, row by row (LayerScale on a residual branch); `branch` is consumed.
fn add_scaled<'m>(
    g: &mut Graph<'m>,
    hidden: &Tensor,
    branch: Tensor,
    scale: &'m [f32],
    frames: usize,
) {
    let dim = scale.len();
    g.scale_columns(&branch, frames, scale);
    g.strided(
        Combine::Add,
        &branch,
        hidden,
        Strided::contiguous(frames * dim),
    );
    drop(branch);
}
