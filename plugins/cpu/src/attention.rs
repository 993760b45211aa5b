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

/// Keys scored side by side: this many dot products advance together.
const KEY_BLOCK: usize = 16;

/// `q · k[j]` for the keys `lo..hi` of kv head `kvh` (`k[keys][kv_heads][d]`), each summed in order from
/// `-0.0` exactly as `Iterator::sum` does (so the scores are bit for bit those of one dot product at a time),
/// but [`KEY_BLOCK`] keys at once: independent additions instead of one chain, which a decode step's
/// attention (one query, every cached key) is bound by.
fn scores_of(q: &[f32], k: &[f32], kvh: usize, kv_heads: usize, lo: usize, hi: usize) -> Vec<f32> {
    let d = q.len();
    let mut scores = Vec::with_capacity(hi - lo);
    // A block of keys transposed, `[d][KEY_BLOCK]` (lanes past the last key stay zero and are dropped).
    let mut block = vec![0.0f32; d * KEY_BLOCK];
    for first in (lo..hi).step_by(KEY_BLOCK) {
        let n = KEY_BLOCK.min(hi - first);
        for l in 0..n {
            let key = &k[((first + l) * kv_heads + kvh) * d..][..d];
            for (i, &x) in key.iter().enumerate() {
                block[i * KEY_BLOCK + l] = x;
            }
        }
        let mut acc = [-0.0f32; KEY_BLOCK];
        for (&qi, column) in q.iter().zip(block.chunks_exact(KEY_BLOCK)) {
            for (a, &x) in acc.iter_mut().zip(column) {
                *a += qi * x;
            }
        }
        scores.extend_from_slice(&acc[..n]);
    }
    scores
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
        let mut scores = scores_of(qv, k, kvh, kv_heads, lo, hi);
        for s in &mut scores {
            *s *= scale;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The blocked scores are bit for bit one dot product at a time (`Iterator::sum`), for any key range.
    #[test]
    fn blocked_scores_are_sequential_dot_products() {
        let (d, kv_heads, keys) = (72, 3, 41);
        let mut seed = 0x2545_f491u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed as f32 / u32::MAX as f32 - 0.5) * 3.0
        };
        let k: Vec<f32> = (0..keys * kv_heads * d).map(|_| next()).collect();
        let q: Vec<f32> = (0..d).map(|_| next()).collect();
        for kvh in 0..kv_heads {
            for (lo, hi) in [(0, keys), (5, 22), (3, 4), (7, 7)] {
                let blocked = scores_of(&q, &k, kvh, kv_heads, lo, hi);
                let sequential: Vec<f32> = (lo..hi)
                    .map(|j| {
                        let kv = &k[(j * kv_heads + kvh) * d..][..d];
                        q.iter().zip(kv).map(|(a, b)| a * b).sum::<f32>()
                    })
                    .collect();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&blocked),
                    bits(&sequential),
                    "kv head {kvh}, keys {lo}..{hi}"
                );
            }
        }
    }
}
