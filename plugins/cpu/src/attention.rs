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

/// Lanes of a dot product's partial sums: independent additions the compiler keeps in vector registers (four
/// AVX2 registers, eight SSE ones), so that the additions do not wait on each other.
const LANES: usize = 32;

/// `Σ a[i]·b[i]` in a fixed order, whatever the machine: lane `l` sums the products `i ≡ l (mod LANES)` in
/// order, then the lanes are added in a fixed tree and the tail in order. A decode step's attention (one
/// query, every cached key) is a few hundred such dots per head; one long chain each would bind it.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let (a_body, a_tail) = a.split_at(a.len() - a.len() % LANES);
    let (b_body, b_tail) = b.split_at(a_body.len());
    for (x, y) in a_body.chunks_exact(LANES).zip(b_body.chunks_exact(LANES)) {
        for l in 0..LANES {
            lanes[l] += x[l] * y[l];
        }
    }
    // Halves added pairwise until one lane is left.
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            lanes[l] += lanes[l + width];
        }
    }
    let mut sum = lanes[0];
    for (x, y) in a_tail.iter().zip(b_tail) {
        sum += x * y;
    }
    sum
}

/// The keys query `qi` sees: `key_start + j ≤ qpos` and `qpos − (key_start + j) < window`.
fn visible_keys(span: &AttentionSpan, qi: usize) -> std::ops::Range<usize> {
    let qpos = span.query_start + qi;
    let lo = span.window.map_or(0, |w| {
        (qpos + 1).saturating_sub(w).saturating_sub(span.key_start)
    });
    let hi = (qpos + 1).saturating_sub(span.key_start).min(span.keys);
    lo..hi
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

    #[cfg(target_arch = "x86_64")]
    if d == AVX512_HEAD_DIM && std::arch::is_x86_feature_detected!("avx512f") {
        // One task per query row and kv head: its query heads read each key and value row once, together.
        chunks_mut(parallel, out, group * d, |idx, o| {
            let (qi, kvh) = (idx / kv_heads, idx % kv_heads);
            let at = (qi * q_heads + kvh * group) * d;
            let g = Head {
                q: &q[at..at + group * d],
                k,
                v,
                kvh,
                kv_heads,
                keys: visible_keys(&span, qi),
                scale,
            };
            // SAFETY: the CPU has AVX-512F (checked above).
            unsafe { g.attend_avx512(o) }
        });
        return;
    }
    #[cfg(target_arch = "x86_64")]
    let avx2 = std::arch::is_x86_feature_detected!("avx2");
    chunks_mut(parallel, out, d, |idx, o| {
        let (qi, h) = (idx / q_heads, idx % q_heads);
        let head = Head {
            q: &q[idx * d..(idx + 1) * d],
            k,
            v,
            kvh: h / group,
            kv_heads,
            keys: visible_keys(&span, qi),
            scale,
        };
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: the CPU has AVX2 (checked above).
            return unsafe { head.attend_avx2(o) };
        }
        head.attend(o, dot)
    });
}

/// [`dot`] with AVX2: its 32 lanes as four 8-wide registers, the same products, sums and tree, so the same
/// bits.
///
/// # Safety
/// The CPU must have AVX2; `a` and `b` must be as long.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    debug_assert_eq!(a.len(), b.len());
    let body = a.len() - a.len() % LANES;
    let mut acc = [_mm256_setzero_ps(); 4];
    for c in (0..body).step_by(LANES) {
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY: `c + 8r + 8 ≤ body ≤ len` for both slices.
            let (x, y) = unsafe {
                (
                    _mm256_loadu_ps(a.as_ptr().add(c + 8 * r)),
                    _mm256_loadu_ps(b.as_ptr().add(c + 8 * r)),
                )
            };
            *acc = _mm256_add_ps(*acc, _mm256_mul_ps(x, y));
        }
    }
    // The tree of `dot`: lanes l += l + 16, then l += l + 8, then within a register 4, 2, 1 apart.
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    let t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    let u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    let mut sum = _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
    for (x, y) in a[body..].iter().zip(&b[body..]) {
        sum += x * y;
    }
    sum
}

/// One query head's attention over its visible keys (for the AVX-512 path, `q` holds every query head that
/// shares the kv head `kvh`).
struct Head<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    kvh: usize,
    kv_heads: usize,
    keys: std::ops::Range<usize>,
    scale: f32,
}

impl Head<'_> {
    /// `o = softmax(q·kᵀ · scale) · v` over the visible keys (zeros when none is visible). The same operations
    /// in the same order on every machine: the vector width only changes how many run at once.
    #[inline(always)]
    fn attend(&self, o: &mut [f32], dot: impl Fn(&[f32], &[f32]) -> f32) {
        let d = self.q.len();
        let row = |j: usize| (j * self.kv_heads + self.kvh) * d;
        o.fill(0.0);
        if self.keys.is_empty() {
            return;
        }
        // A plain loop, so that the dot products are compiled within this function (and its AVX2 build).
        let mut scores = Vec::with_capacity(self.keys.len());
        for j in self.keys.clone() {
            scores.push(dot(self.q, &self.k[row(j)..][..d]) * self.scale);
        }
        let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0.0f32;
        for s in &mut scores {
            *s = (*s - max).exp();
            total += *s;
        }
        for (j, p) in self.keys.clone().zip(&scores) {
            let vv = &self.v[row(j)..][..d];
            let p = p / total;
            for (o, x) in o.iter_mut().zip(vv) {
                *o += p * x;
            }
        }
    }

    /// [`Head::attend`] compiled for AVX2 (wider vectors, the same results).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn attend_avx2(&self, o: &mut [f32]) {
        self.attend(o, |a, b| {
            // SAFETY: AVX2 (this function's contract); the dot's operands are as long (`q` and a key row).
            unsafe { dot_avx2(a, b) }
        })
    }
}

/// The head width the AVX-512 path holds in registers (every Qwen3 LM's).
#[cfg(target_arch = "x86_64")]
const AVX512_HEAD_DIM: usize = 128;

/// The AVX-512 path, on a [`Head`] whose `q` holds every query head of one query row that shares its kv head
/// (grouped-query attention), `[heads][AVX512_HEAD_DIM]`.
#[cfg(target_arch = "x86_64")]
impl Head<'_> {
    /// [`Head::attend`] for each head of the group, with the same operations in the same order (so the same
    /// bits), but each query and each output row held in eight AVX-512 registers and each key and value row read
    /// once for two heads: a decode step's attention was ~45 ns per head and key, most of it loads and stores of
    /// the output row.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    unsafe fn attend_avx512(&self, out: &mut [f32]) {
        let d = AVX512_HEAD_DIM;
        let mut scores = Vec::with_capacity(2 * self.keys.len());
        for (q, o) in self.q.chunks(2 * d).zip(out.chunks_mut(2 * d)) {
            // SAFETY: AVX-512F (this function's contract); `q` and `o` hold one or two heads.
            unsafe {
                if q.len() == 2 * d {
                    self.heads_avx512::<2>(q, o, &mut scores)
                } else {
                    self.heads_avx512::<1>(q, o, &mut scores)
                }
            }
        }
    }

    /// `H` heads (`q` and `o` `[H][HEAD_DIM]`) of the group.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `q.len() = o.len() = H · HEAD_DIM`.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::needless_range_loop)] // one register of a row (`c`) meets every head's, in order
    unsafe fn heads_avx512<const H: usize>(&self, q: &[f32], o: &mut [f32], scores: &mut Vec<f32>) {
        use std::arch::x86_64::*;
        /// Registers of one row.
        const R: usize = AVX512_HEAD_DIM / 16;
        let d = AVX512_HEAD_DIM;
        assert!(q.len() == H * d && o.len() == H * d);
        let n = self.keys.len();
        if n == 0 {
            o.fill(0.0);
            return;
        }
        // Rows grow with `j`: the last visible key's row in bounds makes every one in bounds.
        let row = |j: usize| (j * self.kv_heads + self.kvh) * d;
        let end = row(self.keys.end - 1) + d;
        assert!(end <= self.k.len() && end <= self.v.len());
        // Every load and store below: key and value rows `j` in `keys` hold `d` values (asserted), `q` and `o`
        // hold `H` rows of `d` (asserted), and `c < R = d / 16`.
        let mut qv = [[_mm512_setzero_ps(); R]; H];
        for (h, regs) in qv.iter_mut().enumerate() {
            for (c, r) in regs.iter_mut().enumerate() {
                // SAFETY: in bounds (above).
                *r = unsafe { _mm512_loadu_ps(q.as_ptr().add(h * d + 16 * c)) };
            }
        }
        // Scores `[H][n]`: `dot`'s 32 lanes are the two registers of alternate 16-value chunks, summed in order,
        // then its tree (16 apart, 8, 4, 2, 1).
        scores.clear();
        scores.resize(H * n, 0.0);
        // The cache rows come from memory (a stage's weights pass through the caches between two steps): each
        // key row is fetched a few keys ahead, and each value row while its key is read, for the second pass.
        let prefetch = |values: &[f32], at: usize| {
            for c in 0..R {
                // A prefetch reads nothing the program sees, wherever it points (a safe intrinsic).
                _mm_prefetch::<_MM_HINT_T0>(values.as_ptr().wrapping_add(at + 16 * c).cast());
            }
        };
        const AHEAD: usize = 4;
        for j in self.keys.clone().take(AHEAD) {
            prefetch(self.k, row(j));
        }
        for (jj, j) in self.keys.clone().enumerate() {
            let at = row(j);
            if j + AHEAD < self.keys.end {
                prefetch(self.k, row(j + AHEAD));
            }
            prefetch(self.v, at);
            let mut acc = [[_mm512_setzero_ps(); 2]; H];
            for c in 0..R {
                // SAFETY: in bounds (above).
                let kc = unsafe { _mm512_loadu_ps(self.k.as_ptr().add(at + 16 * c)) };
                for h in 0..H {
                    acc[h][c % 2] = _mm512_add_ps(acc[h][c % 2], _mm512_mul_ps(qv[h][c], kc));
                }
            }
            for (h, [a, b]) in acc.iter().enumerate() {
                let s = _mm512_add_ps(*a, *b);
                let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(s)));
                let s = _mm256_add_ps(_mm512_castps512_ps256(s), high);
                let t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
                let u = _mm_add_ps(t, _mm_movehl_ps(t, t));
                let dot = _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps::<1>(u, u)));
                scores[h * n + jj] = dot * self.scale;
            }
        }
        // Softmax weights as `attend` computes them, head by head.
        let mut totals = [0.0f32; H];
        for (s, total) in scores.chunks_exact_mut(n).zip(&mut totals) {
            let max = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            for s in s.iter_mut() {
                *s = (*s - max).exp();
                *total += *s;
            }
        }
        let mut ov = [[_mm512_setzero_ps(); R]; H];
        for (jj, j) in self.keys.clone().enumerate() {
            let at = row(j);
            let p: [__m512; H] =
                std::array::from_fn(|h| _mm512_set1_ps(scores[h * n + jj] / totals[h]));
            for c in 0..R {
                // SAFETY: in bounds (above).
                let vc = unsafe { _mm512_loadu_ps(self.v.as_ptr().add(at + 16 * c)) };
                for h in 0..H {
                    ov[h][c] = _mm512_add_ps(ov[h][c], _mm512_mul_ps(p[h], vc));
                }
            }
        }
        for (h, regs) in ov.iter().enumerate() {
            for (c, r) in regs.iter().enumerate() {
                // SAFETY: in bounds (above).
                unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(h * d + 16 * c), *r) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pseudo-random values in [−width/2, width/2) (xorshift32 from `seed`).
    fn values(mut seed: u32, width: f32) -> impl FnMut() -> f32 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed as f32 / u32::MAX as f32 - 0.5) * width
        }
    }

    /// Every query head's attention through [`Head::attend`] with the plain [`dot`], one head at a time.
    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        heads: Heads,
        span: AttentionSpan,
        scale: f32,
    ) -> Vec<f32> {
        let d = heads.head_dim;
        let mut out = vec![f32::NAN; q.len()];
        for (idx, o) in out.chunks_mut(d).enumerate() {
            let (qi, h) = (idx / heads.q_heads, idx % heads.q_heads);
            let head = Head {
                q: &q[idx * d..(idx + 1) * d],
                k,
                v,
                kvh: h / (heads.q_heads / heads.kv_heads),
                kv_heads: heads.kv_heads,
                keys: visible_keys(&span, qi),
                scale,
            };
            head.attend(o, dot);
        }
        out
    }

    /// The machine's paths (AVX-512 for 128-wide heads, AVX2, plain) give the plain path's bits, for grouped
    /// heads two, three and eight to a kv head, any visible span (none, windowed), decode and prefill, on one
    /// thread and on several.
    #[test]
    fn every_path_gives_the_plain_paths_bits() {
        let mut next = values(0x9e37_79b9, 4.0);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for (q_heads, kv_heads, head_dim) in [
            (16, 8, 128),
            (6, 2, 128),
            (8, 1, 128),
            (4, 4, 64),
            (4, 2, 72),
        ] {
            for (queries, query_start, keys, key_start, window) in [
                (1, 0, 1, 0, None),
                (1, 16, 17, 0, None),
                (1, 40, 41, 0, Some(8)),
                (5, 10, 15, 0, None),
                (3, 30, 20, 12, Some(6)),
                (2, 3, 6, 5, None), // the first query sees no key
            ] {
                let heads = Heads {
                    q_heads,
                    kv_heads,
                    head_dim,
                };
                let span = AttentionSpan {
                    queries,
                    query_start,
                    keys,
                    key_start,
                    window,
                };
                let q: Vec<f32> = (0..queries * q_heads * head_dim).map(|_| next()).collect();
                let k: Vec<f32> = (0..keys * kv_heads * head_dim).map(|_| next()).collect();
                let v: Vec<f32> = (0..keys * kv_heads * head_dim).map(|_| next()).collect();
                let scale = 1.0 / (head_dim as f32).sqrt();
                let want = reference(&q, &k, &v, heads, span, scale);
                for parallel in [false, true] {
                    let mut got = vec![f32::NAN; q.len()];
                    pool.install(|| attention(parallel, &q, &k, &v, heads, span, scale, &mut got));
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{heads:?} {span:?} parallel {parallel}"
                    );
                }
            }
        }
    }

    /// The lane dot product is within the rounding of an `n`-term sum of the exact one, and its order is its own:
    /// the same operands give the same bits however they are sliced from a longer buffer.
    #[test]
    fn lane_dot_products_are_exact_within_rounding_and_deterministic() {
        let mut next = values(0x2545_f491, 3.0);
        for n in [1, 7, 8, 9, 31, 32, 33, 64, 72, 128, 131] {
            let a: Vec<f32> = (0..n + 5).map(|_| next()).collect();
            let b: Vec<f32> = (0..n + 5).map(|_| next()).collect();
            let got = dot(&a[..n], &b[..n]);
            let exact: f64 = a[..n]
                .iter()
                .zip(&b[..n])
                .map(|(x, y)| *x as f64 * *y as f64)
                .sum();
            let magnitude: f64 = a[..n]
                .iter()
                .zip(&b[..n])
                .map(|(x, y)| (*x as f64 * *y as f64).abs())
                .sum();
            let gamma = n as f64 * f32::EPSILON as f64 / (1.0 - n as f64 * f32::EPSILON as f64);
            assert!(
                (got as f64 - exact).abs() <= gamma * magnitude,
                "n = {n}: {got} vs {exact}"
            );
            let shifted_a: Vec<f32> = [0.5].iter().chain(&a[..n]).copied().collect();
            let shifted_b: Vec<f32> = [2.0].iter().chain(&b[..n]).copied().collect();
            assert_eq!(
                dot(&shifted_a[1..], &shifted_b[1..]).to_bits(),
                got.to_bits()
            );
        }
    }
}
