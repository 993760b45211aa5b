//! The codec's pre-transformer: `input_proj` → N pre-norm layers (RoPE attention over a causal sliding window,
//! SwiGLU MLP, each residual branch scaled per channel by LayerScale) → final RMSNorm → `output_proj`.

use kazeia_backend_abi::{AttentionSpan, Backend, Heads, Weight, WeightFormat};

use super::config::DecoderConfig;
use crate::error::Result;
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
) -> Result<Weight> {
    // The codec decoder is compute-bound; it keeps f32 weights.
    load_linear(
        backend,
        file,
        name,
        dims,
        bias,
        WeightStorage::Convert(WeightFormat::F32),
    )
}

impl PreTransformer {
    pub fn load(
        backend: &dyn Backend,
        file: &dyn Weights,
        prefix: &str,
        cfg: &DecoderConfig,
    ) -> Result<Self> {
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
    pub fn forward(
        &self,
        backend: &dyn Backend,
        state: &mut PreTransformerState,
        x: &[f32],
        frames: usize,
    ) -> Vec<f32> {
        let (h, heads) = (self.hidden, self.heads);
        let (q_out, kv_out) = (
            heads.q_heads * heads.head_dim,
            heads.kv_heads * heads.head_dim,
        );
        let start = state.next;
        let kept = start - state.first;
        let mut hidden = vec![0.0; frames * h];
        backend.linear(&self.input_proj, x, frames, &mut hidden);

        let mut normed = vec![0.0; frames * h];
        let mut q = vec![0.0; frames * q_out];
        let mut k = vec![0.0; frames * kv_out];
        let mut v = vec![0.0; frames * kv_out];
        let mut attn = vec![0.0; frames * q_out];
        let mut branch = vec![0.0; frames * h];
        let mut gate = vec![0.0; frames * self.intermediate];
        let mut up = vec![0.0; frames * self.intermediate];
        let span = AttentionSpan {
            queries: frames,
            query_start: start,
            keys: kept + frames,
            key_start: state.first,
            window: self.window,
        };
        let scale = 1.0 / (heads.head_dim as f32).sqrt();
        for (i, layer) in self.layers.iter().enumerate() {
            normed.copy_from_slice(&hidden);
            backend.rms_norm(&mut normed, h, &layer.input_norm, self.eps);
            backend.linear(&layer.q_proj, &normed, frames, &mut q);
            backend.linear(&layer.k_proj, &normed, frames, &mut k);
            backend.linear(&layer.v_proj, &normed, frames, &mut v);
            backend.rope(
                &mut q,
                heads.q_heads,
                heads.head_dim,
                start,
                self.rope_theta,
            );
            backend.rope(
                &mut k,
                heads.kv_heads,
                heads.head_dim,
                start,
                self.rope_theta,
            );
            state.keys[i].extend_from_slice(&k);
            state.values[i].extend_from_slice(&v);
            backend.attention(
                &q,
                &state.keys[i],
                &state.values[i],
                heads,
                span,
                scale,
                &mut attn,
            );
            backend.linear(&layer.o_proj, &attn, frames, &mut branch);
            add_scaled(&mut hidden, &branch, &layer.attn_scale);

            normed.copy_from_slice(&hidden);
            backend.rms_norm(&mut normed, h, &layer.post_attention_norm, self.eps);
            backend.linear(&layer.gate_proj, &normed, frames, &mut gate);
            backend.linear(&layer.up_proj, &normed, frames, &mut up);
            backend.silu_mul(&mut gate, &up);
            backend.linear(&layer.down_proj, &gate, frames, &mut branch);
            add_scaled(&mut hidden, &branch, &layer.mlp_scale);
        }
        state.next = start + frames;
        if let Some(w) = self.window {
            // The next query (position `next`) sees keys down to `next − w + 1`.
            let keep_from = state.next.saturating_sub(w - 1).max(state.first);
            let drop = (keep_from - state.first) * kv_out;
            for i in 0..self.layers.len() {
                state.keys[i].drain(..drop);
                state.values[i].drain(..drop);
            }
            state.first = keep_from;
        }
        backend.rms_norm(&mut hidden, h, &self.norm, self.eps);
        let mut out = vec![0.0; frames * self.latent];
        backend.linear(&self.output_proj, &hidden, frames, &mut out);
        out
    }
}

/// `hidden += scale ⊙ branch`, row by row (LayerScale on a residual branch).
fn add_scaled(hidden: &mut [f32], branch: &[f32], scale: &[f32]) {
    for (hrow, brow) in hidden
        .chunks_exact_mut(scale.len())
        .zip(branch.chunks_exact(scale.len()))
    {
        for ((hv, bv), s) in hrow.iter_mut().zip(brow).zip(scale) {
            *hv += s * bv;
        }
    }
}
