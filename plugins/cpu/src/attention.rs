//! Rotary position embedding and causal (optionally sliding-window) softmax attention.

use crate::par::chunks_mut;
use kazeia_backend_abi::{AttentionSpan, Heads};

/// `inv_freq[i] = 1 / theta^(2i / head_dim)`, computed in f32 as the reference does.
fn inv_freq(head_dim: usize, theta: f32) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
        .collect()
}

/// Split-half ("NeoX") rotary embedding on `x[rows][heads][head_dim]`, row `r` at position `start_pos + r`.
pub fn rope(x: &mut [f32], heads: usize, head_dim: usize, start_pos: usize, theta: f32) {
    let half = head_dim / 2;
    let freqs = inv_freq(head_dim, theta);
    let mut cos = vec![0.0f32; half];
    let mut sin = vec![0.0f32; half];
    for (r, row) in x.chunks_exact_mut(heads * head_dim).enumerate() {
        let pos = (start_pos + r) as f32;
        for i in 0..half {
            let angle = pos * freqs[i];
            cos[i] = angle.cos();
            sin[i] = angle.sin();
        }
        for head in row.chunks_exact_mut(head_dim) {
            let (a, b) = head.split_at_mut(half);
            for i in 0..half {
                let (x1, x2) = (a[i], b[i]);
                a[i] = x1 * cos[i] - x2 * sin[i];
                b[i] = x2 * cos[i] + x1 * sin[i];
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub fn attention(
    parallel: bool,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    heads: Heads,
    span: AttentionSpan,
    scale: f32,
    out: &mut [f32],
) {
    let Heads {
        q_heads,
        kv_heads,
        head_dim: d,
    } = heads;
    assert!(
        q_heads % kv_heads == 0,
        "query heads must be a multiple of kv heads"
    );
    let group = q_heads / kv_heads;
    assert_eq!(q.len(), span.queries * q_heads * d, "attention q size");
    assert_eq!(k.len(), span.keys * kv_heads * d, "attention k size");
    assert_eq!(v.len(), span.keys * kv_heads * d, "attention v size");
    assert_eq!(out.len(), q.len(), "attention out size");

    chunks_mut(parallel, out, d, |idx, o| {
        let (qi, h) = (idx / q_heads, idx % q_heads);
        let kvh = h / group;
        let qpos = span.query_start + qi;
        // visible keys: key_start + j ≤ qpos and qpos − (key_start + j) < window
        let mut lo = 0usize;
        if let Some(w) = span.window {
            lo = (qpos + 1).saturating_sub(w).saturating_sub(span.key_start);
        }
        let hi = (qpos + 1).saturating_sub(span.key_start).min(span.keys);
        o.fill(0.0);
        if lo >= hi {
            return;
        }
        let qv = &q[idx * d..(idx + 1) * d];
        let mut scores: Vec<f32> = (lo..hi)
            .map(|j| {
                let kv = &k[(j * kv_heads + kvh) * d..][..d];
                qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f32>() * scale
            })
            .collect();
        let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0.0f32;
        for s in &mut scores {
            *s = (*s - max).exp();
            total += *s;
        }
        for (j, p) in (lo..hi).zip(&scores) {
            let vv = &v[(j * kv_heads + kvh) * d..][..d];
            let p = p / total;
            for (o, x) in o.iter_mut().zip(vv) {
                *o += p * x;
            }
        }
    });
}
