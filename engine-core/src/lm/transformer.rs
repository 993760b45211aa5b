//! The Qwen3 decoder-layer stack shared by the talker and the code predictor: pre-norm layers with per-head
//! q/k RMSNorm, grouped-query attention with split-half RoPE over a KV cache, SwiGLU MLP, and a final RMSNorm.

use kazeia_backend_abi::{AttentionSpan, Backend, Heads, Weight};

use crate::error::Result;
use crate::linear::{load_linear, WeightStorage};
use crate::weights::Weights;

/// Shapes of one stack, from the talker's or the code predictor's config.
#[derive(Clone, Debug)]
pub struct StackShape {
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: Heads,
    pub eps: f32,
    pub rope_theta: f32,
    pub attention_bias: bool,
    /// Sliding window per layer (`None`: full causal attention).
    pub windows: Vec<Option<usize>>,
    /// How the layers' linear weights are stored.
    pub storage: WeightStorage,
}

struct Layer {
    input_norm: Vec<f32>,
    post_attention_norm: Vec<f32>,
    q_proj: Weight,
    k_proj: Weight,
    v_proj: Weight,
    o_proj: Weight,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    gate_proj: Weight,
    up_proj: Weight,
    down_proj: Weight,
}

pub struct DecoderStack {
    shape: StackShape,
    layers: Vec<Layer>,
    norm: Vec<f32>,
}

/// Keys and values of every layer for positions `0..len`, allocated once for `capacity` positions, with the
/// scratch buffers of a forward pass (sized on first use, then reused every step).
pub struct KvCache {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    len: usize,
    capacity: usize,
    row: usize,
    scratch: Scratch,
}

#[derive(Default)]
struct Scratch {
    hidden: Vec<f32>,
    normed: Vec<f32>,
    q: Vec<f32>,
    attn: Vec<f32>,
    branch: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
}

impl Scratch {
    /// Sizes every buffer for `rows` rows (no allocation once they have been that large).
    fn fit(&mut self, rows: usize, s: &StackShape) {
        let q_out = s.heads.q_heads * s.heads.head_dim;
        for (buf, width) in [
            (&mut self.hidden, s.hidden),
            (&mut self.normed, s.hidden),
            (&mut self.q, q_out),
            (&mut self.attn, q_out),
            (&mut self.branch, s.hidden),
            (&mut self.gate, s.intermediate),
            (&mut self.up, s.intermediate),
        ] {
            buf.resize(rows * width, 0.0);
        }
    }
}

impl KvCache {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }
}

impl DecoderStack {
    /// Loads `{prefix}.layers.{i}.*` and `{prefix}.norm.weight`.
    pub fn load(
        backend: &dyn Backend,
        weights: &dyn Weights,
        prefix: &str,
        shape: StackShape,
    ) -> Result<Self> {
        let (h, inter, hd) = (shape.hidden, shape.intermediate, shape.heads.head_dim);
        let (q_out, kv_out) = (shape.heads.q_heads * hd, shape.heads.kv_heads * hd);
        let bias = shape.attention_bias;
        let mut layers = Vec::with_capacity(shape.layers);
        for i in 0..shape.layers {
            let p = format!("{prefix}.layers.{i}");
            let lin = |name: &str, dims, bias| {
                load_linear(
                    backend,
                    weights,
                    &format!("{p}.{name}"),
                    dims,
                    bias,
                    shape.storage,
                )
            };
            layers.push(Layer {
                input_norm: weights.tensor_shaped(&format!("{p}.input_layernorm.weight"), &[h])?,
                post_attention_norm: weights
                    .tensor_shaped(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                q_proj: lin("self_attn.q_proj", (q_out, h), bias)?,
                k_proj: lin("self_attn.k_proj", (kv_out, h), bias)?,
                v_proj: lin("self_attn.v_proj", (kv_out, h), bias)?,
                o_proj: lin("self_attn.o_proj", (h, q_out), bias)?,
                q_norm: weights.tensor_shaped(&format!("{p}.self_attn.q_norm.weight"), &[hd])?,
                k_norm: weights.tensor_shaped(&format!("{p}.self_attn.k_norm.weight"), &[hd])?,
                gate_proj: lin("mlp.gate_proj", (inter, h), false)?,
                up_proj: lin("mlp.up_proj", (inter, h), false)?,
                down_proj: lin("mlp.down_proj", (h, inter), false)?,
            });
        }
        Ok(DecoderStack {
            norm: weights.tensor_shaped(&format!("{prefix}.norm.weight"), &[h])?,
            shape,
            layers,
        })
    }

    pub fn hidden(&self) -> usize {
        self.shape.hidden
    }

    pub fn new_cache(&self, capacity: usize) -> KvCache {
        let row = self.shape.heads.kv_heads * self.shape.heads.head_dim;
        KvCache {
            keys: (0..self.layers.len())
                .map(|_| vec![0.0; capacity * row])
                .collect(),
            values: (0..self.layers.len())
                .map(|_| vec![0.0; capacity * row])
                .collect(),
            len: 0,
            capacity,
            row,
            scratch: Scratch::default(),
        }
    }

    /// Runs `rows` new positions `x[rows][hidden]` (continuing after the cache) and returns the final-normed
    /// hidden states `[rows][hidden]`, which live in the cache's scratch until the next call.
    pub fn forward<'c>(
        &self,
        backend: &dyn Backend,
        x: &[f32],
        rows: usize,
        cache: &'c mut KvCache,
    ) -> &'c [f32] {
        let s = &self.shape;
        let (h, hd) = (s.hidden, s.heads.head_dim);
        let kv_out = s.heads.kv_heads * hd;
        let start = cache.len;
        assert!(
            start + rows <= cache.capacity,
            "KV cache capacity {} exceeded",
            cache.capacity
        );
        assert_eq!(x.len(), rows * h, "stack input size");

        let KvCache {
            keys,
            values,
            row,
            scratch: sc,
            ..
        } = cache;
        sc.fit(rows, s);
        sc.hidden.copy_from_slice(x);
        let scale = 1.0 / (hd as f32).sqrt();
        for (i, layer) in self.layers.iter().enumerate() {
            sc.normed.copy_from_slice(&sc.hidden);
            backend.rms_norm(&mut sc.normed, h, &layer.input_norm, s.eps);
            backend.linear(&layer.q_proj, &sc.normed, rows, &mut sc.q);
            backend.rms_norm(&mut sc.q, hd, &layer.q_norm, s.eps);
            backend.rope(&mut sc.q, s.heads.q_heads, hd, start, s.rope_theta);

            let new = start * *row..(start + rows) * *row;
            backend.linear(&layer.k_proj, &sc.normed, rows, &mut keys[i][new.clone()]);
            backend.rms_norm(&mut keys[i][new.clone()], hd, &layer.k_norm, s.eps);
            backend.rope(
                &mut keys[i][new.clone()],
                s.heads.kv_heads,
                hd,
                start,
                s.rope_theta,
            );
            backend.linear(&layer.v_proj, &sc.normed, rows, &mut values[i][new]);

            let total = start + rows;
            let span = AttentionSpan {
                queries: rows,
                query_start: start,
                keys: total,
                key_start: 0,
                window: s.windows[i],
            };
            backend.attention(
                &sc.q,
                &keys[i][..total * kv_out],
                &values[i][..total * kv_out],
                s.heads,
                span,
                scale,
                &mut sc.attn,
            );
            backend.linear(&layer.o_proj, &sc.attn, rows, &mut sc.branch);
            add(&mut sc.hidden, &sc.branch);

            sc.normed.copy_from_slice(&sc.hidden);
            backend.rms_norm(&mut sc.normed, h, &layer.post_attention_norm, s.eps);
            backend.linear(&layer.gate_proj, &sc.normed, rows, &mut sc.gate);
            backend.linear(&layer.up_proj, &sc.normed, rows, &mut sc.up);
            backend.silu_mul(&mut sc.gate, &sc.up);
            backend.linear(&layer.down_proj, &sc.gate, rows, &mut sc.branch);
            add(&mut sc.hidden, &sc.branch);
        }
        backend.rms_norm(&mut sc.hidden, h, &self.norm, s.eps);
        cache.len = start + rows;
        &cache.scratch.hidden
    }
}

pub fn add(acc: &mut [f32], x: &[f32]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}
