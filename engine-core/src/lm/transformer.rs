//! The Qwen3 decoder-layer stack shared by the talker and the code predictor: pre-norm layers with per-head
//! q/k RMSNorm, grouped-query attention with split-half RoPE over a KV cache, SwiGLU MLP, and a final RMSNorm.
//!
//! Mirrors the layers and final norm of `Qwen3TTSTalkerModel` (`Qwen3TTSTalkerDecoderLayer`,
//! `Qwen3TTSTalkerAttention`, `Qwen3TTSTalkerRotaryEmbedding`) and of `Qwen3TTSTalkerCodePredictorModel`
//! (`Qwen3TTSDecoderLayer`, `Qwen3TTSAttention`, `Qwen3TTSRotaryEmbedding`), both with `Qwen3TTSTalkerTextMLP`
//! and `Qwen3TTSRMSNorm`, in qwen-tts 0.1.1's `qwen_tts/core/models/modeling_qwen3_tts.py`.

use kazeia_backend_abi::{AttentionSpan, Backend, Combine, Heads, Strided, View, Weight};

use crate::error::Result;
use crate::graph::{Graph, Tensor};
use crate::linear::{load_linear, load_stacked_linear, WeightStorage};
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
    /// q_proj, k_proj and v_proj stacked: one op (`load_stacked_linear`), its output split by [`columns`].
    qkv_proj: Weight,
    o_proj: Weight,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    /// gate_proj and up_proj stacked.
    gate_up_proj: Weight,
    down_proj: Weight,
}

pub struct DecoderStack {
    shape: StackShape,
    layers: Vec<Layer>,
    norm: Vec<f32>,
}

/// Ids that name each cache's buffers on a device for the cache's life ([`Graph::resident_state`]).
static NEXT_CACHE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Keys and values of every layer for positions `0..len`, allocated once for `capacity` positions.
pub struct KvCache {
    /// Unique to this cache: its layer `l` keys are resident under `id·2^16 + 2l`, values `+ 1`.
    id: u64,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    len: usize,
    capacity: usize,
    row: usize,
    /// The last [`DecoderStack::forward`]'s output.
    out: Vec<f32>,
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

    /// A copy of the keys and values of every position held so far.
    pub fn prefix(&self) -> KvPrefix {
        let used = self.len * self.row;
        KvPrefix {
            keys: self.keys.iter().map(|k| k[..used].to_vec()).collect(),
            values: self.values.iter().map(|v| v[..used].to_vec()).collect(),
            rows: self.len,
        }
    }

    /// Starts an empty cache from `prefix` (made by a cache of the same stack): positions `0..prefix.rows` then
    /// hold exactly what running those rows left in the cache that made it. `false` (and the cache unchanged)
    /// if this cache is not empty, too small, or of another shape.
    pub fn start_from(&mut self, prefix: &KvPrefix) -> bool {
        let used = prefix.rows * self.row;
        let fits = self.len == 0
            && prefix.rows <= self.capacity
            && prefix.keys.len() == self.keys.len()
            && prefix.values.len() == self.values.len()
            && prefix
                .keys
                .iter()
                .chain(&prefix.values)
                .all(|k| k.len() == used);
        if !fits {
            return false;
        }
        for (dst, src) in self.keys.iter_mut().zip(&prefix.keys) {
            dst[..used].copy_from_slice(src);
        }
        // Written outside any list: under a new id, a device that keeps this cache resident takes it as a new
        // buffer and uploads it, rather than trusting its copy of the old contents (see `Graph::resident_state`).
        self.id = NEXT_CACHE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for (dst, src) in self.values.iter_mut().zip(&prefix.values) {
            dst[..used].copy_from_slice(src);
        }
        self.len = prefix.rows;
        true
    }
}

/// The keys and values of a cache's first positions ([`KvCache::prefix`]), to start other caches from.
#[derive(Clone, Debug)]
pub struct KvPrefix {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    rows: usize,
}

impl KvPrefix {
    /// Positions held.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Zeros for `rows` positions of `layers` layers of `row` values each (tests).
    #[cfg(test)]
    pub(crate) fn zeros(layers: usize, rows: usize, row: usize) -> Self {
        KvPrefix {
            keys: vec![vec![0.0; rows * row]; layers],
            values: vec![vec![0.0; rows * row]; layers],
            rows,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.keys
            .iter()
            .chain(&self.values)
            .map(|k| k.len() * 4)
            .sum()
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
            let stacked = |parts: &[(&str, usize)], bias| {
                let names: Vec<(String, usize)> = parts
                    .iter()
                    .map(|&(n, o)| (format!("{p}.{n}"), o))
                    .collect();
                let parts: Vec<(&str, usize)> =
                    names.iter().map(|(n, o)| (n.as_str(), *o)).collect();
                load_stacked_linear(backend, weights, &parts, h, bias, shape.storage)
            };
            layers.push(Layer {
                input_norm: weights.tensor_shaped(&format!("{p}.input_layernorm.weight"), &[h])?,
                post_attention_norm: weights
                    .tensor_shaped(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                qkv_proj: stacked(
                    &[
                        ("self_attn.q_proj", q_out),
                        ("self_attn.k_proj", kv_out),
                        ("self_attn.v_proj", kv_out),
                    ],
                    bias,
                )?,
                o_proj: lin("self_attn.o_proj", (h, q_out), bias)?,
                q_norm: weights.tensor_shaped(&format!("{p}.self_attn.q_norm.weight"), &[hd])?,
                k_norm: weights.tensor_shaped(&format!("{p}.self_attn.k_norm.weight"), &[hd])?,
                gate_up_proj: stacked(&[("mlp.gate_proj", inter), ("mlp.up_proj", inter)], false)?,
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
            id: NEXT_CACHE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            keys: (0..self.layers.len())
                .map(|_| vec![0.0; capacity * row])
                .collect(),
            values: (0..self.layers.len())
                .map(|_| vec![0.0; capacity * row])
                .collect(),
            len: 0,
            capacity,
            row,
            out: Vec::new(),
        }
    }

    /// Runs `rows` new positions `x[rows][hidden]` (continuing after the cache) as one list of ops, and returns
    /// the final-normed hidden states `[rows][hidden]`, which live in the cache until the next call.
    pub fn forward<'c>(
        &self,
        backend: &dyn Backend,
        x: &[f32],
        rows: usize,
        cache: &'c mut KvCache,
    ) -> Result<&'c [f32]> {
        let out = {
            let mut g = Graph::new(backend);
            let x = g.input(x.to_vec());
            let hidden = self.forward_graph(&mut g, x, rows, cache);
            let out = g.take(hidden)?;
            g.finish()?;
            out
        };
        cache.out = out;
        Ok(&cache.out)
    }

    /// The ops of one step of several sequences at once: `x` holds `rows[b]` new positions of sequence `b` after
    /// those of the sequences before it, and `caches[b]` is sequence `b`'s cache. The linear layers, norms and
    /// the MLP run on all the rows together (each weight read once for every row); RoPE, the cache appends and
    /// attention run per sequence at its own positions. Each row's result is what [`DecoderStack::forward_graph`]
    /// gives on that sequence alone, wherever the backend computes every row of an op independently of the
    /// others (the CPU backend below its GEMM threshold of rows). Returns the final-normed hidden states in the
    /// order of `x`.
    pub fn forward_batch_graph<'m>(
        &'m self,
        g: &mut Graph<'m>,
        x: Tensor,
        rows: &[usize],
        caches: Vec<&'m mut KvCache>,
    ) -> Tensor {
        let s = &self.shape;
        let (h, hd) = (s.hidden, s.heads.head_dim);
        let (q_out, kv_out) = (s.heads.q_heads * hd, s.heads.kv_heads * hd);
        assert_eq!(rows.len(), caches.len(), "one cache per sequence");
        let all: usize = rows.iter().sum();
        assert_eq!(g.len(&x), all * h, "stack input size");
        // Per sequence: its first row in `x`, its rows, its cache's positions before and after, its layers'
        // buffers.
        struct Seq<'m> {
            offset: usize,
            rows: usize,
            start: usize,
            total: usize,
            id: u64,
            keys: std::slice::IterMut<'m, Vec<f32>>,
            values: std::slice::IterMut<'m, Vec<f32>>,
        }
        let mut offset = 0;
        let mut seqs: Vec<Seq<'m>> = caches
            .into_iter()
            .zip(rows)
            .map(|(cache, &r)| {
                let start = cache.len;
                let total = start + r;
                assert!(
                    total <= cache.capacity,
                    "KV cache capacity {} exceeded",
                    cache.capacity
                );
                assert_eq!(cache.row, kv_out, "cache of another stack");
                cache.len = total;
                let KvCache {
                    id, keys, values, ..
                } = cache;
                let seq = Seq {
                    offset,
                    rows: r,
                    start,
                    total,
                    id: *id << 16,
                    keys: keys.iter_mut(),
                    values: values.iter_mut(),
                };
                offset += r;
                seq
            })
            .collect();
        let scale = 1.0 / (hd as f32).sqrt();
        // Rows `seq` of a tensor `width` wide, copied from `src` into `dst` at the same or at no offset.
        let part = |seq: &Seq<'_>, width: usize, from: bool| {
            let n = seq.rows * width;
            let (src, dst) = if from {
                (seq.offset * width, 0)
            } else {
                (0, seq.offset * width)
            };
            Strided {
                rows: 1,
                cols: n,
                src: View::rows(src, n),
                dst: View::rows(dst, n),
            }
        };
        let hidden = x;
        for (i, layer) in self.layers.iter().enumerate() {
            let normed = g.duplicate(&hidden);
            g.rms_norm(&normed, h, &layer.input_norm, s.eps);
            let qkv_out = q_out + 2 * kv_out;
            let qkv = g.linear(&layer.qkv_proj, &normed, all, qkv_out);
            drop(normed);
            let q = columns(g, &qkv, all, qkv_out, 0..q_out);
            g.rms_norm(&q, hd, &layer.q_norm, s.eps);
            let k = columns(g, &qkv, all, qkv_out, q_out..q_out + kv_out);
            g.rms_norm(&k, hd, &layer.k_norm, s.eps);
            let attn = g.zeros(all * q_out);
            for seq in &mut seqs {
                let (layer_keys, layer_values) = (
                    seq.keys.next().expect("a cache of this stack"),
                    seq.values.next().expect("a cache of this stack"),
                );
                let q_seq = g.zeros(seq.rows * q_out);
                g.strided(Combine::Copy, &q, &q_seq, part(seq, q_out, true));
                g.rope(&q_seq, s.heads.q_heads, hd, seq.start, s.rope_theta);
                let k_seq = g.zeros(seq.rows * kv_out);
                g.strided(Combine::Copy, &k, &k_seq, part(seq, kv_out, true));
                g.rope(&k_seq, s.heads.kv_heads, hd, seq.start, s.rope_theta);
                // The cache outlives the graph ('m), and its buffers change only through the appends below.
                let used = seq.total * kv_out;
                let cached_keys = g.resident_state(layer_keys, used, seq.id + 2 * i as u64);
                let cached_values = g.resident_state(layer_values, used, seq.id + 2 * i as u64 + 1);
                let n = seq.rows * kv_out;
                let append = |src| Strided {
                    rows: 1,
                    cols: n,
                    src: View::rows(src, n),
                    dst: View::rows(seq.start * kv_out, n),
                };
                g.strided(Combine::Copy, &k_seq, &cached_keys, append(0));
                // The values straight from their columns of `qkv` to the cache.
                let values = Strided {
                    rows: seq.rows,
                    cols: kv_out,
                    src: View::rows(seq.offset * qkv_out + q_out + kv_out, qkv_out),
                    dst: View::rows(seq.start * kv_out, kv_out),
                };
                g.strided(Combine::Copy, &qkv, &cached_values, values);
                let span = AttentionSpan {
                    queries: seq.rows,
                    query_start: seq.start,
                    keys: seq.total,
                    key_start: 0,
                    window: s.windows[i],
                };
                let attn_seq =
                    g.attention(&q_seq, &cached_keys, &cached_values, s.heads, span, scale);
                g.strided(Combine::Copy, &attn_seq, &attn, part(seq, q_out, false));
            }
            drop((q, k, qkv));
            output_and_mlp(g, layer, s, attn, &hidden, all);
        }
        g.rms_norm(&hidden, h, &self.norm, s.eps);
        hidden
    }

    /// [`DecoderStack::forward`]'s ops on `g`: `x[rows][hidden]` (changed in place) → the final-normed hidden
    /// states; the new keys and values go to `cache` when the graph runs.
    pub fn forward_graph<'m>(
        &'m self,
        g: &mut Graph<'m>,
        x: Tensor,
        rows: usize,
        cache: &'m mut KvCache,
    ) -> Tensor {
        let s = &self.shape;
        let (h, hd) = (s.hidden, s.heads.head_dim);
        let (q_out, kv_out) = (s.heads.q_heads * hd, s.heads.kv_heads * hd);
        let start = cache.len;
        let total = start + rows;
        assert!(
            total <= cache.capacity,
            "KV cache capacity {} exceeded",
            cache.capacity
        );
        assert_eq!(g.len(&x), rows * h, "stack input size");
        cache.len = total;
        let KvCache {
            id,
            keys,
            values,
            row,
            ..
        } = cache;
        let id = *id << 16;
        let row = *row;
        // The new rows at the end of the cached positions that attention reads.
        let append = Strided {
            rows: 1,
            cols: rows * row,
            src: View::rows(0, rows * row),
            dst: View::rows(start * row, rows * row),
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let hidden = x;
        for (i, ((layer, layer_keys), layer_values)) in self
            .layers
            .iter()
            .zip(keys.iter_mut())
            .zip(values.iter_mut())
            .enumerate()
        {
            let normed = g.duplicate(&hidden);
            g.rms_norm(&normed, h, &layer.input_norm, s.eps);
            let qkv_out = q_out + 2 * kv_out;
            let qkv = g.linear(&layer.qkv_proj, &normed, rows, qkv_out);
            drop(normed);
            let q = columns(g, &qkv, rows, qkv_out, 0..q_out);
            g.rms_norm(&q, hd, &layer.q_norm, s.eps);
            g.rope(&q, s.heads.q_heads, hd, start, s.rope_theta);
            let k = columns(g, &qkv, rows, qkv_out, q_out..q_out + kv_out);
            g.rms_norm(&k, hd, &layer.k_norm, s.eps);
            g.rope(&k, s.heads.kv_heads, hd, start, s.rope_theta);
            // The cache outlives the graph ('m), and its buffers change only through the appends below.
            let cached_keys = g.resident_state(layer_keys, total * row, id + 2 * i as u64);
            let cached_values = g.resident_state(layer_values, total * row, id + 2 * i as u64 + 1);
            g.strided(Combine::Copy, &k, &cached_keys, append);
            // The values straight from their columns of `qkv` to the cache.
            let values = Strided {
                rows,
                cols: kv_out,
                src: View::rows(q_out + kv_out, qkv_out),
                dst: View::rows(start * row, row),
            };
            g.strided(Combine::Copy, &qkv, &cached_values, values);
            drop((k, qkv));

            let span = AttentionSpan {
                queries: rows,
                query_start: start,
                keys: total,
                key_start: 0,
                window: s.windows[i],
            };
            let attn = g.attention(&q, &cached_keys, &cached_values, s.heads, span, scale);
            drop(q);
            output_and_mlp(g, layer, s, attn, &hidden, rows);
        }
        g.rms_norm(&hidden, h, &self.norm, s.eps);
        hidden
    }
}

/// What follows attention in every layer, on `rows` rows: the output projection of `attn` (consumed) and the
/// MLP on the post-attention norm, each added to `hidden`.
fn output_and_mlp<'m>(
    g: &mut Graph<'m>,
    layer: &'m Layer,
    s: &StackShape,
    attn: Tensor,
    hidden: &Tensor,
    rows: usize,
) {
    let h = s.hidden;
    let branch = g.linear(&layer.o_proj, &attn, rows, h);
    drop(attn);
    g.strided(Combine::Add, &branch, hidden, Strided::contiguous(rows * h));
    drop(branch);

    let normed = g.duplicate(hidden);
    g.rms_norm(&normed, h, &layer.post_attention_norm, s.eps);
    let inter = s.intermediate;
    let gate_up = g.linear(&layer.gate_up_proj, &normed, rows, 2 * inter);
    drop(normed);
    let gate = columns(g, &gate_up, rows, 2 * inter, 0..inter);
    let up = columns(g, &gate_up, rows, 2 * inter, inter..2 * inter);
    drop(gate_up);
    g.silu_mul(&gate, &up);
    drop(up);
    let branch = g.linear(&layer.down_proj, &gate, rows, h);
    drop(gate);
    g.strided(Combine::Add, &branch, hidden, Strided::contiguous(rows * h));
}

/// Columns `cols` of every one of the `rows` rows of `x` (rows `width` wide), as a new tensor `[rows][cols.len()]`.
fn columns<'m>(
    g: &mut Graph<'m>,
    x: &Tensor,
    rows: usize,
    width: usize,
    cols: std::ops::Range<usize>,
) -> Tensor {
    let n = cols.len();
    let out = g.zeros(rows * n);
    let shape = Strided {
        rows,
        cols: n,
        src: View::rows(cols.start, width),
        dst: View::rows(0, n),
    };
    g.strided(Combine::Copy, x, &out, shape);
    out
}
