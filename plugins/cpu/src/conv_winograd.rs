//! Dilated convolutions (and, in the fast mode, the upsamplers' transposed ones) by Winograd's minimal filtering
//! F(m, k): `m` outputs of a `k`-tap filter from `α = m + k − 1` products instead of `m·k`.
//!
//! The codec decoder's vocoder spends most of its time in `k = 7` convolutions (three per residual unit, channel
//! to channel), already at the FMA units' peak: fewer multiplications is what is left. A tile of `m` outputs `y(t0
//! + j·d)` (dilation `d`) reads the inputs `g_i = x(t0 + i·d)`, `i < α`; then
//!
//! `y = Aᵀ · ((G·w) ⊙ (Bᵀ·g))`, per output channel summed over the input channels,
//!
//! so each of the `α` transformed points is one GEMM `U_ξ[cout][cin] · V_ξ[cin][tiles]` — run on the same tile
//! kernels as a `k = 1` convolution — between an input transform (`Bᵀ`, per input channel) and an output
//! transform (`Aᵀ`, per output channel), both cheap next to the GEMMs when the channels are many. The matrices
//! come from Toom-Cook on the points 0, ±1, ±2, ±½ and ∞ (computed in f64 here, not tabulated): `G` evaluates
//! the filter's polynomial, `Bᵀ` is the transposed interpolation, `Aᵀ` the transposed evaluation of the output's.
//!
//! F(2, 7) takes 8 products for 14 multiplications per channel pair (1.75× fewer); the fast decoder mode's
//! F(6, 7) ([`FAST_M`]) 12 for 42 (3.5× fewer), at more rounding. The arithmetic is f32 as
//! before, but not the same rounding: against an f64 reference, ~1.5e-6 of the output's peak where the direct
//! kernel has ~1.5e-7 (the points ±2, ±½ weigh the products unevenly); on the decoder fixtures the waveform stays
//! within 5e-6 of the official one (bound 1e-4) and a chunked decode within 5e-6 of the one-shot (8e-6 on the
//! AVX2 path; bound 1e-5). `U` is computed in f64 from the weights and stored as the layer's format: f16 rounds
//! `U`, not `w`, which costs ~5 dB of the f16 decoder's SNR (fixtures: 55.3 → 49.6 and 48.7 → 43.4 dB; bound 30).
//! Against the official decoder evaluated in f64 (`engine-core/tests/it/codec_truth.rs`), that rounding puts the
//! tiny fixtures' waveforms 1.5–2× as far from the truth as the official f32's (the direct kernel: 0.4–1×), past
//! the default's contract of 1.25×: Winograd is an opt-in ([`crate::CpuBackend::with_winograd_convolutions`] or
//! `KAZEIA_CONV_WINOGRAD=1`), for a fast decoder mode with a bound of its own.
//!
//! The vocoder's upsamplers, transposed convolutions of kernel `2s` and stride `s`, are `s` output phases, each
//! a 2-tap convolution of the same input: `y(t·s + p) = w_p·x(t) + w_(p+s)·x(t − 1)`. The fast mode computes
//! them by F(m, 2) per phase ([`FAST_TRANSPOSED_M`]): a tile's `α = m + 1` transformed inputs serve all `s·cout`
//! phase rows, so the GEMMs are `U_ξ[s·cout][cin] · V_ξ[cin][tiles]`, `(m + 1)/m` products an output instead of
//! 2. Their transformed weights are `α/2` times the layer's, held as f32, so only the layers that suit it by
//! [`MAX_CHANNEL_PAIRS`] take it.
//!
//! Tiles are laid out so that every transform is a contiguous loop: the input's columns are split by phase
//! (`P_p[q·d + s] = x((q·m + p)·d + s)`), so `g_i` of tile `n = q·d + s` is `P_{i mod m}[n + (i div m)·d]`;
//! outputs are produced per phase `j` and interleaved back.

use std::cell::RefCell;

use kazeia_backend_abi::WeightFormat;

use crate::conv::{ConvWeight, Layout};
use crate::gemm_call::{for_column_tiles, SharedOut};

/// Outputs per tile of the opt-in Winograd of `KAZEIA_CONV_WINOGRAD` ([`crate::ConvPrecision::Winograd`]).
pub(crate) const M: usize = 2;

/// Outputs per tile of the fast decoder mode's ([`crate::ConvPrecision::Fast`]): F(6, 7) takes 12 products for
/// 42 multiplications per channel pair (3.5× fewer), on the points 0, ±1, ±2, ±½, ±3, ±⅓ and ∞. Its rounding
/// grows with the points (~1e-5 of a layer's peak against ~1.5e-6 for F(2, 7)), still far inside the fast
/// mode's bound: the released decoder's waveform ~89 dB SNR against the exact one (bound 40). Against F(4, 7)
/// (91 dB): decoder 0.92/0.97 against 1.04/1.01 s per s of audio; F(8, 7) would need points past ±3, whose
/// powers grow the rounding faster (AMD EPYC Zen 4, 2 threads, a shared machine).
pub(crate) const FAST_M: usize = 6;

/// Outputs per tile of the fast mode's transposed convolutions (kernel `2·stride`), F(m, 2) per output phase:
/// F(4, 2) takes 5 products for 8 multiplications per channel pair (1.6× fewer), on the points 0, ±1, 2 and ∞,
/// ~1e-6 of a layer's peak from an f64 reference. The vocoder's blocks 3 and 4 upsamplers on an eight-frame
/// chunk: 14.6 → 11.1 and 12.1 → 9.6 ms of CPU time on one thread, 8.0 → 5.2 and 5.8 → 4.5 ms on two
/// (`conv_speed`); F(5, 2) and F(6, 2) within 3 % of it, with `α/2` times the weights, F(7, 2) and F(8, 2)
/// slower (AMD EPYC Zen 4).
pub(crate) const FAST_TRANSPOSED_M: usize = 4;

/// The evaluation points before ∞, in the order taken (F(2, 7) takes the first seven).
const POINTS: [f64; 11] = [
    0.0,
    1.0,
    -1.0,
    2.0,
    -2.0,
    0.5,
    -0.5,
    3.0,
    -3.0,
    1.0 / 3.0,
    -1.0 / 3.0,
];

/// Tiles per unit of work: a chunk's transformed inputs and products stay in L2 for the small layers.
const TILES_PER_CHUNK: usize = 128;

/// A chunk's transformed inputs and products at most (wide layers take fewer tiles), unless that leaves fewer
/// than [`MIN_TILES`]: each thread keeps a buffer this large. 2 MiB against none: decoder within noise (AMD Zen 4,
/// 2 threads: 0.320/0.317 vs 0.342/0.316 s per s of audio), 11 MB less peak RSS.
const CHUNK_BYTES: usize = 2 << 20;

/// Tiles a chunk has at least (where the call has them): enough columns for the GEMM's register tiles, and
/// for reading the weights once per chunk to be worth it.
const MIN_TILES: usize = 16;

/// Channel pairs above which a convolution's weights are too large for Winograd to pay: such a layer streams
/// megabytes per call, and the decoder's one (the 1024→1536 input convolution, 1.6 M pairs, 4–32 columns a call)
/// is bound by that stream, which Winograd makes 8/7 longer: 1.0–1.6 against 0.55–0.67 ms direct on a one-frame
/// chunk, 3.3–4.9 against 3.4 ms on an eight-frame one (AMD EPYC Zen 4, 2 threads, f16). The vocoder's own
/// (768² and less) gain.
const MAX_CHANNEL_PAIRS: usize = 1 << 20;

/// Whether a convolution is worth computing this way: enough taps to save multiplications, channels enough that
/// the per-channel transforms are small next to the GEMMs, and not so many that the weights' stream bounds it
/// ([`MAX_CHANNEL_PAIRS`]).
pub(crate) fn suits(cout: usize, cin: usize, k: usize, m: usize) -> bool {
    k >= 5
        && cout >= 32
        && cin >= 32
        && cout * cin <= MAX_CHANNEL_PAIRS
        && m + k - 1 <= POINTS.len() + 1
}

/// Whether a transposed convolution is worth computing this way: kernel `2·stride` (two taps per output phase),
/// channels enough for the transforms to be small next to the GEMMs, and no more than [`MAX_CHANNEL_PAIRS`]
/// phase-channel pairs (`stride·cout·cin`): the vocoder's blocks 3 and 4 (295 k and 55 k pairs, their
/// transformed weights +8 MB). Block 2's (1.5 M pairs) would hold 30 MB more for 14.5 → 12 ms on an
/// eight-frame chunk and 2.0 → 2.1–2.4 ms on a one-frame chunk (its 30 MB streamed for 6 tiles); block 1's
/// (9.4 M) 190 MB, slower on every chunk.
pub(crate) fn suits_transposed(cin: usize, cout: usize, k: usize, stride: usize) -> bool {
    k == 2 * stride
        && stride >= 2
        && cout >= 32
        && cin >= 32
        && stride * cout * cin <= MAX_CHANNEL_PAIRS
}

/// The F(m, k) matrices: `bt` `[α][α]`, `g` `[α][k]`, `at` `[m][α]`.
pub(crate) struct Transforms {
    pub m: usize,
    pub alpha: usize,
    pub bt: Vec<f64>,
    pub g: Vec<f64>,
    pub at: Vec<f64>,
}

/// The powers `a⁰ … a^(n−1)` of a point, or of ∞ (`None`): the leading coefficient alone.
fn powers(point: Option<f64>, n: usize) -> Vec<f64> {
    match point {
        Some(a) => (0..n).map(|p| a.powi(p as i32)).collect(),
        None => (0..n).map(|p| f64::from(u8::from(p == n - 1))).collect(),
    }
}

/// The inverse of the `n × n` matrix `a` (row-major), by Gauss-Jordan elimination with partial pivoting.
fn inverse(mut a: Vec<f64>, n: usize) -> Vec<f64> {
    let mut inv: Vec<f64> = (0..n * n)
        .map(|i| f64::from(u8::from(i / n == i % n)))
        .collect();
    for col in 0..n {
        let pivot = (col..n)
            .max_by(|&r, &s| a[r * n + col].abs().total_cmp(&a[s * n + col].abs()))
            .expect("a row");
        for c in 0..n {
            a.swap(col * n + c, pivot * n + c);
            inv.swap(col * n + c, pivot * n + c);
        }
        let p = a[col * n + col];
        assert!(
            p != 0.0,
            "distinct evaluation points make an invertible matrix"
        );
        for c in 0..n {
            a[col * n + c] /= p;
            inv[col * n + c] /= p;
        }
        for r in (0..n).filter(|&r| r != col) {
            let f = a[r * n + col];
            for c in 0..n {
                a[r * n + c] -= f * a[col * n + c];
                inv[r * n + c] -= f * inv[col * n + c];
            }
        }
    }
    inv
}

impl Transforms {
    /// F(m, k) on the first `m + k − 2` of [`POINTS`] and ∞.
    pub(crate) fn new(m: usize, k: usize) -> Self {
        let alpha = m + k - 1;
        assert!(alpha - 1 <= POINTS.len(), "F({m}, {k}) needs more points");
        let point = |i: usize| (i < alpha - 1).then(|| POINTS[i]);
        // Row i: the point's powers, for a polynomial of degree α − 1 (the product's), k − 1 (the filter's)
        // and m − 1 (the tile's).
        let vandermonde: Vec<f64> = (0..alpha).flat_map(|i| powers(point(i), alpha)).collect();
        let c = inverse(vandermonde, alpha);
        Transforms {
            m,
            alpha,
            bt: (0..alpha * alpha)
                .map(|e| c[(e % alpha) * alpha + e / alpha])
                .collect(),
            g: (0..alpha).flat_map(|i| powers(point(i), k)).collect(),
            at: (0..m * alpha)
                .map(|e| powers(point(e % alpha), m)[e / alpha])
                .collect(),
        }
    }
}

thread_local! {
    /// A chunk's phase rows, transformed inputs and products (reused: megabytes per call). Not `conv.rs`'s
    /// scratch: the GEMMs run inside this borrow, and an F16 layer on the `gemm` path widens into that one.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on a zeroed-or-stale scratch buffer of `len` floats of this thread (its own if a call on this thread
/// is already using it: a waiting worker may run another layer's chunk).
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < len {
                buf.resize(len, 0.0);
            }
            f(&mut buf[..len])
        }
        Err(_) => f(&mut vec![0.0; len]),
    })
}

/// A `Conv1d` weight `[cout][cin][k]` as the `α` GEMM panels `U_ξ = Σ_t G[ξ][t]·w[·][·][t]`; or a
/// `ConvTranspose1d` weight `[cin][cout][2s]` (stride `s`) as the 2-tap convolutions of its `s` output phases.
pub(crate) struct Winograd {
    bt: Vec<f32>,
    at: Vec<f32>,
    m: usize,
    alpha: usize,
    /// `U_ξ` as `k = 1` convolutions (no bias): the tile kernels' GEMMs, of `cout · stride` rows.
    products: Vec<ConvWeight>,
    cout: usize,
    cin: usize,
    k: usize,
    /// Product rows per output channel: 1 for a convolution, a transposed convolution's stride (its phases,
    /// row `co·s + p` the outputs `y[co][t·s + p]`).
    stride: usize,
}

impl Winograd {
    pub(crate) fn new(
        w: &[f32],
        (cout, cin, k): (usize, usize, usize),
        format: WeightFormat,
        layout: Layout,
        m: usize,
    ) -> Self {
        assert_eq!(w.len(), cout * cin * k, "conv1d weight size");
        Self::from_taps(w, (cout, cin, k), 1, format, layout, m)
    }

    /// A transposed convolution of kernel `2s` and stride `s`: output phase `p` of `y[co][t·s + p] = Σ_ci
    /// w[ci][co][p]·x[ci][t] + w[ci][co][p + s]·x[ci][t − 1]` is the 2-tap convolution of the input with one
    /// zero either side by the taps `(w[·][co][p + s], w[·][co][p])`, and all `s·cout` phases share its
    /// transformed tiles.
    pub(crate) fn transposed(
        w: &[f32],
        (cin, cout, s): (usize, usize, usize),
        format: WeightFormat,
        layout: Layout,
        m: usize,
    ) -> Self {
        let k = 2 * s;
        assert_eq!(w.len(), cin * cout * k, "transposed conv weight size");
        // Rows `co·s + p` of `[cout·s][cin][2]`.
        let taps: Vec<f32> = (0..cout * s)
            .flat_map(|o| {
                let (co, p) = (o / s, o % s);
                (0..cin).flat_map(move |ci| {
                    let at = (ci * cout + co) * k;
                    [w[at + p + s], w[at + p]]
                })
            })
            .collect();
        Self::from_taps(&taps, (cout, cin, 2), s, format, layout, m)
    }

    /// The panels of `w[cout·stride][cin][k]`.
    fn from_taps(
        w: &[f32],
        (cout, cin, k): (usize, usize, usize),
        stride: usize,
        format: WeightFormat,
        layout: Layout,
        m: usize,
    ) -> Self {
        let t = Transforms::new(m, k);
        let products = (0..t.alpha)
            .map(|xi| {
                let g = &t.g[xi * k..(xi + 1) * k];
                let u: Vec<f32> = w
                    .chunks_exact(k)
                    .map(|taps| {
                        let sum: f64 = taps.iter().zip(g).map(|(&w, &g)| f64::from(w) * g).sum();
                        sum as f32
                    })
                    .collect();
                ConvWeight::with_layout(&u, (cout * stride, cin, 1), None, format, layout)
            })
            .collect();
        Winograd {
            bt: t.bt.iter().map(|&v| v as f32).collect(),
            at: t.at.iter().map(|&v| v as f32).collect(),
            m: t.m,
            alpha: t.alpha,
            products,
            cout,
            cin,
            k,
            stride,
        }
    }

    /// The valid convolution of `x[cin][len]` with dilation `d`, plus `bias`, into `y[cout][len − (k−1)·d]`
    /// (the caller checked the sizes).
    pub(crate) fn forward(
        &self,
        bias: &[f32],
        x: &[f32],
        len: usize,
        d: usize,
        y: &mut [f32],
        par: gemm::Parallelism,
    ) {
        let lout = len - (self.k - 1) * d;
        self.run(Some(bias), (x, len, 0), (d, lout), y, par);
    }

    /// The full transposed convolution of `x[cin][len]` into `y[cout][(len + 1)·s]` (as
    /// [`crate::ConvTransposeWeight::forward`]; the caller checked the sizes).
    pub(crate) fn forward_transposed(
        &self,
        x: &[f32],
        len: usize,
        y: &mut [f32],
        par: gemm::Parallelism,
    ) {
        self.run(None, (x, len, 1), (1, len + 1), y, par);
    }

    /// The `lout` outputs per product row of the valid convolution with dilation `d` of `x[cin][len]` after
    /// `lead` zeros (and zeros after it), plus `bias`, into `y[cout][lout·stride]`.
    fn run(
        &self,
        bias: Option<&[f32]>,
        (x, len, lead): (&[f32], usize, usize),
        (d, lout): (usize, usize),
        y: &mut [f32],
        par: gemm::Parallelism,
    ) {
        let (m, alpha, cin) = (self.m, self.alpha, self.cin);
        let outputs = self.cout * self.stride;
        // Tile rows q: tiles n = q·d + s (s < d) start at t0 = q·m·d + s.
        let rows = lout.div_ceil(m * d);
        // Phase rows past a chunk's last tile row that its taps reach.
        let reach = (alpha - 1) / m;
        let out = SharedOut::new(y);
        // At least two chunks per thread, which then run side by side (the transforms are serial within a
        // chunk), or one chunk whose GEMMs use every thread: `for_column_tiles` runs fewer than two per thread one
        // after the other, each reading all the weights (block 1's convolutions on a one-frame chunk, 16-18
        // tiles, read their 9.4 MB four times). Each chunk at most TILES_PER_CHUNK tiles and about CHUNK_BYTES of
        // transformed inputs and products.
        let threads = match par {
            gemm::Parallelism::Rayon(n) => n.max(1),
            _ => 1,
        };
        let tiles =
            TILES_PER_CHUNK.min((CHUNK_BYTES / (4 * alpha * (cin + outputs))).max(MIN_TILES));
        let side_by_side = rows >= 2 * threads && rows * d >= 2 * threads * MIN_TILES;
        // Chunks of equal size where they can be, a multiple of the threads when side by side: 43 tile rows on
        // one thread ran as 21 + 21 + 1, the last chunk's GEMMs on a column or a few, reading all the weights for
        // them.
        let chunks = rows.div_ceil((tiles / d).max(1));
        let chunks = if side_by_side {
            chunks.max(2 * threads).next_multiple_of(threads)
        } else {
            chunks
        };
        let even = rows.div_ceil(chunks);
        let chunk_rows = if side_by_side && rows.div_ceil(even) < 2 * threads {
            (rows / chunks).max(1)
        } else {
            even
        };
        for_column_tiles(rows, chunk_rows, par, |q0, q1, par| {
            let nt = (q1 - q0) * d;
            let span = (q1 - q0 + reach) * d;
            let (v_len, p_len) = (alpha * cin * nt, m * span);
            with_scratch(v_len + alpha * outputs * nt + p_len, |buf| {
                let (v, rest) = buf.split_at_mut(v_len);
                let (products, phases) = rest.split_at_mut(alpha * outputs * nt);
                let inputs = self.input_terms(span, d);
                for (ci, row) in x.chunks_exact(len).enumerate() {
                    self.split_phases(row, lead, (q0, span, d), phases);
                    self.transform_input(phases, &inputs, (ci, nt), v);
                }
                for (xi, u) in self.products.iter().enumerate() {
                    let v = &v[xi * cin * nt..(xi + 1) * cin * nt];
                    let p = &mut products[xi * outputs * nt..(xi + 1) * outputs * nt];
                    u.forward(v, nt, 1, p, par);
                }
                // The phase rows are free again: one of them holds an output phase at a time.
                let phase = &mut phases[..nt];
                self.transform_output(products, bias, phase, (q0, d), (out, lout));
            });
        });
    }

    /// `phases[p][u] = row((q0·m + (u div d)·m + p)·d + u mod d − lead)`, zero outside the row, for `u < span`:
    /// runs of `d` values.
    fn split_phases(
        &self,
        row: &[f32],
        lead: usize,
        (q0, span, d): (usize, usize, usize),
        phases: &mut [f32],
    ) {
        let m = self.m;
        for (p, phase) in phases.chunks_exact_mut(span).enumerate() {
            gather_runs(d, phase, (row, lead), ((q0 * m + p) * d, m * d));
        }
    }

    /// `v[ξ][ci][n] = Σ_i Bᵀ[ξ][i] · phases[i mod m][n + (i div m)·d]` for the chunk's `nt` tiles, by the
    /// combinations of [`Winograd::input_terms`].
    fn transform_input(
        &self,
        phases: &[f32],
        inputs: &[Combination],
        (ci, nt): (usize, usize),
        v: &mut [f32],
    ) {
        for (xi, combination) in inputs.iter().enumerate() {
            let dst = &mut v[(xi * self.cin + ci) * nt..][..nt];
            combination.combine(phases, 0, 0.0, dst);
        }
    }

    /// The input transform's rows `ξ` as combinations of the phase rows (`span` long) of a chunk.
    fn input_terms(&self, span: usize, d: usize) -> Vec<Combination> {
        let (m, alpha) = (self.m, self.alpha);
        (0..alpha)
            .map(|xi| {
                let row = &self.bt[xi * alpha..][..alpha];
                Combination::new(row, |i| (i % m) * span + (i / m) * d)
            })
            .collect()
    }

    /// `y[co][((q·m + j)·d + s)·stride + p] = bias[co] + Σ_ξ Aᵀ[j][ξ] · products[ξ][co·stride + p][n]` for the
    /// chunk's tiles `n = (q − q0)·d + s` (as many as `phase` is long, the buffer of one output phase), within
    /// the `lout` outputs of each product row.
    fn transform_output(
        &self,
        products: &[f32],
        bias: Option<&[f32]>,
        phase: &mut [f32],
        (q0, d): (usize, usize),
        (y, lout): (SharedOut, usize),
    ) {
        let (m, alpha, stride, nt) = (self.m, self.alpha, self.stride, phase.len());
        let outputs = self.cout * stride;
        // The chunk's columns: its tile rows' outputs, one contiguous range.
        let first = q0 * m * d;
        let width = (nt * m).min(lout - first);
        // Output phase j: the products' rows ξ of one output row, whose first is `products[o·nt..]`.
        let combinations: Vec<Combination> = (0..m)
            .map(|j| Combination::new(&self.at[j * alpha..][..alpha], |xi| xi * outputs * nt))
            .collect();
        for co in 0..self.cout {
            // SAFETY: this chunk's columns of row `co`, which no other chunk writes.
            let dst = unsafe { y.part((co * lout + first) * stride, width * stride) };
            let constant = bias.map_or(0.0, |b| b[co]);
            for p in 0..stride {
                let o = co * stride + p;
                for (j, combination) in combinations.iter().enumerate() {
                    combination.combine(products, o * nt, constant, phase);
                    // Tile row r's values go to columns ((r·m + j)·d + s)·stride + p (d or stride is 1).
                    scatter_runs(d, phase, dst, (j * d * stride + p, m * d * stride));
                }
            }
        }
    }
}

/// Lanes summed at once in [`Terms::combine`]: a block of accumulators stays in registers across the terms (four
/// AVX-512 registers: independent chains of adds).
const LANES: usize = 64;

/// The most points a transform has.
const MAX_ALPHA: usize = POINTS.len() + 1;

/// A transform's row as a linear combination of rows of a buffer at fixed offsets, zero coefficients left out:
/// made once per chunk, not per channel (an integer division, a test and a slice per coefficient, per channel,
/// then a copy of the 250-byte list: the transforms' own code 7.7 → 4.5 % of `conv_speed`'s fast mode).
#[derive(Clone, Copy)]
struct Combination {
    coefficients: [f32; MAX_ALPHA],
    offsets: [usize; MAX_ALPHA],
    len: usize,
}

impl Combination {
    /// `Σ_i coefficients[i] · buffer[offset(i)..]`.
    fn new(coefficients: &[f32], offset: impl Fn(usize) -> usize) -> Self {
        let mut combination = Combination {
            coefficients: [0.0; MAX_ALPHA],
            offsets: [0; MAX_ALPHA],
            len: 0,
        };
        for (i, &c) in coefficients.iter().enumerate().filter(|(_, &c)| c != 0.0) {
            combination.coefficients[combination.len] = c;
            combination.offsets[combination.len] = offset(i);
            combination.len += 1;
        }
        combination
    }

    /// `dst[n] = constant + Σ_i c_i · buffer[offset_i + shift + n]` ([`Terms::combine`]).
    fn combine(&self, buffer: &[f32], shift: usize, constant: f32, dst: &mut [f32]) {
        let n = dst.len();
        let mut terms = Terms {
            coefficients: &self.coefficients[..self.len],
            rows: [&[]; MAX_ALPHA],
        };
        for (row, &offset) in terms.rows.iter_mut().zip(&self.offsets[..self.len]) {
            *row = &buffer[offset + shift..][..n];
        }
        terms.combine(constant, dst);
    }
}

/// A linear combination `Σ c · src` of equally long rows (as many as the coefficients).
struct Terms<'a> {
    coefficients: &'a [f32],
    rows: [&'a [f32]; MAX_ALPHA],
}

impl Terms<'_> {
    /// `dst[n] = constant + Σ c · row[n]`, `LANES` elements at a time, compiled for the widest vectors this CPU
    /// has (the plugin's baseline build would use 4-lane SSE).
    fn combine(&self, constant: f32, dst: &mut [f32]) {
        // The convolutions' own choice (`KAZEIA_X86_CONV=avx2` tests the AVX2 path on an AVX-512 CPU).
        #[cfg(target_arch = "x86_64")]
        match crate::conv_x86::selected() {
            Some(crate::conv_x86::Isa::Avx512) => {
                // SAFETY: `selected` takes only a kernel the CPU has (AVX-512F).
                return unsafe { self.combine_avx512(constant, dst) };
            }
            Some(crate::conv_x86::Isa::Avx2) => {
                // SAFETY: as above (AVX2 and FMA).
                return unsafe { self.combine_avx2(constant, dst) };
            }
            None => {}
        }
        self.combine_portable(constant, dst)
    }

    /// [`Terms::combine`] in four zmm accumulators (then one, then masked), fused multiply-adds.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn combine_avx512(&self, constant: f32, dst: &mut [f32]) {
        use std::arch::x86_64::*;
        let (coefficients, rows) = (self.coefficients, &self.rows[..self.coefficients.len()]);
        let n = dst.len();
        assert!(
            rows.iter().all(|r| r.len() == n),
            "rows as long as the result"
        );
        let out = dst.as_mut_ptr();
        let mut i = 0;
        // SAFETY: every load and store below is of lanes below n (full vectors while i + 16·k + 16 ≤ n, else
        // masked) of `rows` and `dst`, all n long (asserted).
        unsafe {
            while i + 64 <= n {
                let mut acc = [_mm512_set1_ps(constant); 4];
                for (&c, row) in coefficients.iter().zip(rows) {
                    let (c, src) = (_mm512_set1_ps(c), row.as_ptr().add(i));
                    for (k, a) in acc.iter_mut().enumerate() {
                        *a = _mm512_fmadd_ps(c, _mm512_loadu_ps(src.add(16 * k)), *a);
                    }
                }
                for (k, a) in acc.iter().enumerate() {
                    _mm512_storeu_ps(out.add(i + 16 * k), *a);
                }
                i += 64;
            }
            while i < n {
                let mask: __mmask16 = if n - i >= 16 {
                    0xffff
                } else {
                    (1u16 << (n - i)) - 1
                };
                let mut acc = _mm512_set1_ps(constant);
                for (&c, row) in coefficients.iter().zip(rows) {
                    let values = _mm512_maskz_loadu_ps(mask, row.as_ptr().add(i));
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(c), values, acc);
                }
                _mm512_mask_storeu_ps(out.add(i), mask, acc);
                i += 16;
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn combine_avx2(&self, constant: f32, dst: &mut [f32]) {
        self.combine_portable(constant, dst)
    }

    #[inline(always)]
    fn combine_portable(&self, constant: f32, dst: &mut [f32]) {
        let (coefficients, rows) = (self.coefficients, &self.rows[..self.coefficients.len()]);
        assert!(
            rows.iter().all(|r| r.len() == dst.len()),
            "rows as long as the result"
        );
        let mut blocks = dst.chunks_exact_mut(LANES);
        let mut start = 0;
        for block in &mut blocks {
            let mut acc = [constant; LANES];
            for (&c, row) in coefficients.iter().zip(rows) {
                let src: &[f32; LANES] = row[start..start + LANES].try_into().expect("a block");
                for (a, &s) in acc.iter_mut().zip(src) {
                    *a += c * s;
                }
            }
            block.copy_from_slice(&acc);
            start += LANES;
        }
        let rest = blocks.into_remainder();
        rest.fill(constant);
        for (&c, row) in coefficients.iter().zip(rows) {
            for (a, &s) in rest.iter_mut().zip(&row[start..]) {
                *a += c * s;
            }
        }
    }
}

/// `dst`'s runs of `d` values, run `r` from `src[first + r·step − lead..]` (zeros outside `src`). `d` is a
/// constant for the decoder's dilations, so that a run is a few moves rather than a copy call; runs of one value
/// are a strided copy.
fn gather_runs(
    d: usize,
    dst: &mut [f32],
    (src, lead): (&[f32], usize),
    (first, step): (usize, usize),
) {
    fn runs<const D: usize>(
        d: usize,
        dst: &mut [f32],
        (src, lead): (&[f32], usize),
        (first, step): (usize, usize),
    ) {
        let d = if D > 0 { D } else { d };
        for (r, run) in dst.chunks_exact_mut(d).enumerate() {
            let s = first + r * step;
            match s.checked_sub(lead).and_then(|s| src.get(s..s + d)) {
                Some(values) => run.copy_from_slice(values),
                None => {
                    for (k, v) in run.iter_mut().enumerate() {
                        let at = (s + k).checked_sub(lead);
                        *v = at.and_then(|i| src.get(i)).copied().unwrap_or(0.0);
                    }
                }
            }
        }
    }
    match d {
        1 => {
            // The values before `src` (at most `lead`), then those in it, then zeros.
            let before = lead.saturating_sub(first).div_ceil(step).min(dst.len());
            let (zeros, rest) = dst.split_at_mut(before);
            zeros.fill(0.0);
            let start = (first + before * step).checked_sub(lead);
            let values = start.and_then(|s| src.get(s..)).unwrap_or_default();
            let filled = values.len().div_ceil(step).min(rest.len());
            let (inside, after) = rest.split_at_mut(filled);
            for (v, run) in inside.iter_mut().zip(values.chunks(step)) {
                *v = run[0];
            }
            after.fill(0.0);
        }
        3 => runs::<3>(d, dst, (src, lead), (first, step)),
        9 => runs::<9>(d, dst, (src, lead), (first, step)),
        _ => runs::<0>(d, dst, (src, lead), (first, step)),
    }
}

/// `src`'s runs of `d` values, run `r` to `dst[first + r·step..]` (what falls past its end dropped); as
/// [`gather_runs`].
fn scatter_runs(d: usize, src: &[f32], dst: &mut [f32], (first, step): (usize, usize)) {
    fn runs<const D: usize>(d: usize, src: &[f32], dst: &mut [f32], (first, step): (usize, usize)) {
        let d = if D > 0 { D } else { d };
        for (r, run) in src.chunks_exact(d).enumerate() {
            let s = first + r * step;
            let len = dst.len();
            match dst.get_mut(s..s + d) {
                Some(out) => out.copy_from_slice(run),
                None if s < len => dst[s..].copy_from_slice(&run[..len - s]),
                None => break,
            }
        }
    }
    match d {
        1 => {
            let outputs = dst.get_mut(first..).unwrap_or_default().chunks_mut(step);
            for (run, &v) in outputs.zip(src) {
                run[0] = v;
            }
        }
        3 => runs::<3>(d, src, dst, (first, step)),
        9 => runs::<9>(d, src, dst, (first, step)),
        _ => runs::<0>(d, src, dst, (first, step)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The direct convolution in f64.
    fn reference(
        w: &[f32],
        b: &[f32],
        x: &[f32],
        (cout, cin, k, len, d): (usize, usize, usize, usize, usize),
    ) -> Vec<f64> {
        let lout = len - (k - 1) * d;
        let mut y = vec![0.0; cout * lout];
        for o in 0..cout {
            for t in 0..lout {
                let mut s = f64::from(b[o]);
                for i in 0..cin {
                    for tap in 0..k {
                        s += f64::from(w[(o * cin + i) * k + tap])
                            * f64::from(x[i * len + t + tap * d]);
                    }
                }
                y[o * lout + t] = s;
            }
        }
        y
    }

    fn random(n: usize, seed: u64) -> Vec<f32> {
        crate::conv::tests::values(n, seed, 1.0)
    }

    #[test]
    fn the_transforms_compute_a_correlation_exactly_in_f64() {
        for (m, k) in [(2, 3), (2, 7), (4, 3), (3, 5), (4, 2), (6, 2)] {
            let t = Transforms::new(m, k);
            let w: Vec<f64> = (0..k).map(|i| 0.3 + i as f64 * 0.7).collect();
            let g: Vec<f64> = (0..t.alpha).map(|i| 1.0 - i as f64 * 0.45).collect();
            let uw: Vec<f64> = (0..t.alpha)
                .map(|xi| (0..k).map(|i| t.g[xi * k + i] * w[i]).sum())
                .collect();
            let vg: Vec<f64> = (0..t.alpha)
                .map(|xi| (0..t.alpha).map(|i| t.bt[xi * t.alpha + i] * g[i]).sum())
                .collect();
            for j in 0..m {
                let y: f64 = (0..t.alpha)
                    .map(|xi| t.at[j * t.alpha + xi] * uw[xi] * vg[xi])
                    .sum();
                let direct: f64 = (0..k).map(|i| w[i] * g[j + i]).sum();
                assert!(
                    (y - direct).abs() < 1e-9,
                    "F({m}, {k}) output {j}: {y} vs {direct}"
                );
            }
        }
    }
    /// Max |error| over max |reference|, of F32 and of F16 weights (against the reference on the F32 weights).
    fn errors(
        (cout, cin, k, len, d): (usize, usize, usize, usize, usize),
        layout: Layout,
        par: gemm::Parallelism,
        m: usize,
    ) -> Vec<f64> {
        let w = random(cout * cin * k, 1);
        let b = random(cout, 2);
        let x = random(cin * len, 3);
        let reference = reference(&w, &b, &x, (cout, cin, k, len, d));
        let peak = reference.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        [WeightFormat::F32, WeightFormat::F16]
            .into_iter()
            .map(|format| {
                let conv = if m == FAST_M {
                    ConvWeight::winograd_f32(&w, (cout, cin, k), Some(&b), format, layout, m)
                } else {
                    ConvWeight::winograd(&w, (cout, cin, k), Some(&b), format, layout, m)
                };
                let mut y = vec![f32::NAN; reference.len()];
                conv.forward(&x, len, d, &mut y, par);
                let err = y
                    .iter()
                    .zip(&reference)
                    .fold(0.0f64, |m, (&y, &r)| m.max((f64::from(y) - r).abs()));
                err / peak
            })
            .collect()
    }

    fn layouts() -> Vec<Layout> {
        let mut all = vec![Layout::Gemm];
        #[cfg(target_arch = "x86_64")]
        for isa in [crate::conv_x86::Isa::Avx512, crate::conv_x86::Isa::Avx2] {
            if isa.available() {
                all.push(Layout::X86(isa));
            }
        }
        #[cfg(target_arch = "aarch64")]
        all.push(Layout::Neon);
        all
    }

    #[test]
    fn it_computes_the_convolution_for_every_dilation_length_and_layout() {
        for layout in layouts() {
            for (cout, cin, len, d) in [
                (40, 33, 6 * 9 + 1, 9),
                (40, 33, 6 * 9 + 20, 9),
                (32, 48, 300, 3),
                (33, 32, 7, 1),
                (64, 40, 611, 1),
                (48, 96, 6 * 3 + 1000, 3),
            ] {
                let dims = (cout, cin, 7, len, d);
                let errors = errors(dims, layout, gemm::Parallelism::Rayon(2), M);
                // f32: a few ulps of the sums (the direct kernel's own rounding is ~1e-7 here); f16: the weights'
                // rounding (2⁻¹¹ relative, summed over 7·cin terms of either sign).
                assert!(
                    errors[0] < 2e-6,
                    "{layout:?} {dims:?}: f32 error {:e}",
                    errors[0]
                );
                assert!(
                    errors[1] < 2e-3,
                    "{layout:?} {dims:?}: f16 error {:e}",
                    errors[1]
                );
            }
        }
    }

    /// The fast mode's F(6, 7) at awkward shapes (columns off the 6-output tiles, dilations, one tile, many):
    /// f32 rounding grown by its points, ~2e-5 of the peak (F(2, 7): < 2e-6), still the convolution; F16 weights
    /// ~2e-4 (their own rounding: the transformed weights are held as f32).
    #[test]
    fn the_fast_tile_computes_the_convolution() {
        for layout in layouts() {
            for (cout, cin, len, d) in [
                (40, 33, 6 * 9 + 1, 9),
                (40, 33, 6 * 9 + 23, 9),
                (32, 48, 301, 3),
                (33, 32, 7, 1),
                (64, 40, 613, 1),
                (96, 96, 6 * 3 + 1000, 3),
            ] {
                let dims = (cout, cin, 7, len, d);
                let errors = errors(dims, layout, gemm::Parallelism::Rayon(2), FAST_M);

                assert!(
                    errors[0] < 5e-5,
                    "{layout:?} {dims:?}: f32 error {:e}",
                    errors[0]
                );
                assert!(
                    errors[1] < 1e-3,
                    "{layout:?} {dims:?}: f16 error {:e}",
                    errors[1]
                );
            }
        }
    }

    /// `(exact, bound)` of each output `y[co][t·s + p]` of the transposed convolution (kernel `2s`) that F(m, 2)
    /// computes: the exact sum in f64, and the rounding bound of the algorithm, `γ(n) · Σ_ξ |Aᵀ[j][ξ]| · Σ_ci
    /// |U_ξ| · Σ_i |Bᵀ[ξ][i]| · |g_i|` for output `j` of the tile of inputs `g` (Higham's for a sum of products,
    /// each rounding on the path of a product counted in `n`: the f32 coefficients of Bᵀ and Aᵀ, the α-term
    /// transforms, `U`'s rounding to f32 and the GEMM's cin-term sum), first order, whatever the summation order.
    fn transposed_bound(
        w: &[f32],
        x: &[f32],
        (cin, cout, s, len): (usize, usize, usize, usize),
        m: usize,
    ) -> Vec<(f64, f64)> {
        let t = Transforms::new(m, 2);
        let alpha = t.alpha;
        let n = 2 * (alpha + 1) + 1 + cin + 1;
        let gamma = {
            let nu = n as f64 * f64::from(f32::EPSILON) / 2.0;
            nu / (1.0 - nu)
        };
        // The input with one zero either side (and zeros past it for the last tile).
        let padded = |ci: usize, u: usize| -> f64 {
            u.checked_sub(1)
                .and_then(|u| (u < len).then(|| f64::from(x[ci * len + u])))
                .unwrap_or(0.0)
        };
        let lfull = (len + 1) * s;
        let mut out = vec![(0.0, 0.0); cout * lfull];
        for co in 0..cout {
            for p in 0..s {
                let taps = |ci: usize| {
                    let at = (ci * cout + co) * 2 * s;
                    (f64::from(w[at + p + s]), f64::from(w[at + p]))
                };
                for time in 0..=len {
                    let (q, j) = (time / m, time % m);
                    let exact: f64 = (0..cin)
                        .map(|ci| taps(ci).0 * padded(ci, time) + taps(ci).1 * padded(ci, time + 1))
                        .sum();
                    let mut abs = 0.0;
                    for xi in 0..alpha {
                        let (g0, g1) = (t.g[xi * 2], t.g[xi * 2 + 1]);
                        let products: f64 = (0..cin)
                            .map(|ci| {
                                let (w0, w1) = taps(ci);
                                let v: f64 = (0..alpha)
                                    .map(|i| (t.bt[xi * alpha + i] * padded(ci, q * m + i)).abs())
                                    .sum();
                                (g0 * w0 + g1 * w1).abs() * v
                            })
                            .sum();
                        abs += t.at[j * alpha + xi].abs() * products;
                    }
                    out[co * lfull + time * s + p] = (exact, gamma * abs);
                }
            }
        }
        out
    }

    /// The fast mode's transposed convolutions, F(m, 2) per output phase, within the algorithm's rounding bound
    /// ([`transposed_bound`]) for every decoder stride (8, 5, 4, 3) and small odd shapes: one input column,
    /// columns off the tiles, one chunk and many side by side; F32 and F16 weights (against the exact sum on the
    /// rounded ones); the same bits with 1, 2 and 3 threads. The bound is what f32 guarantees of the algorithm,
    /// worst case (4e-6 to 8e-5 of the outputs' peak here); the errors are 1–7 % of it (≤ 1e-6 of the peak).
    #[test]
    fn the_fast_transposed_tile_is_within_its_rounding_bound() {
        for layout in layouts() {
            for (cin, cout, s, len) in [
                (40, 33, 8, 7),
                (48, 32, 5, 29),
                (33, 40, 4, 61),
                (64, 40, 3, 611),
                (32, 96, 3, 1),
                (5, 3, 2, 1),
                (7, 9, 3, 13),
            ] {
                let w = random(cin * cout * 2 * s, 6);
                let x = random(cin * len, 7);
                let lfull = (len + 1) * s;
                for format in [WeightFormat::F32, WeightFormat::F16] {
                    let held = match format {
                        WeightFormat::F16 => crate::conv::tests::rounded(&w),
                        _ => w.clone(),
                    };
                    let bound = transposed_bound(&held, &x, (cin, cout, s, len), FAST_TRANSPOSED_M);
                    let conv = crate::ConvTransposeWeight::winograd_f32(
                        &w,
                        (cin, cout, 2 * s),
                        s,
                        format,
                        layout,
                        FAST_TRANSPOSED_M,
                    );
                    let mut first: Option<Vec<u32>> = None;
                    for par in [
                        gemm::Parallelism::None,
                        gemm::Parallelism::Rayon(2),
                        gemm::Parallelism::Rayon(3),
                    ] {
                        let what =
                            format!("{layout:?} {cin}→{cout} s{s} len {len} {format} {par:?}");
                        let mut y = vec![f32::NAN; cout * lfull];
                        conv.forward(&x, len, &mut y, par);
                        for (n, (&got, &(exact, bound))) in y.iter().zip(&bound).enumerate() {
                            let err = (f64::from(got) - exact).abs();
                            assert!(
                                err <= bound,
                                "{what}: output {n} is {got}, exact {exact}: error {err:e} > bound {bound:e}"
                            );
                        }
                        let bits: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
                        assert_eq!(
                            *first.get_or_insert(bits.clone()),
                            bits,
                            "{what}: threads change the bits"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn only_the_vocoders_wide_convolutions_take_it() {
        // The released vocoder's 7-tap convolutions, 768² down to 96² channel pairs.
        for c in [768, 384, 192, 96] {
            assert!(suits(c, c, 7, M), "{c} channels");
        }
        // Its 1024→1536 input convolution: bound by its weights' stream.
        assert!(!suits(1536, 1024, 7, M));
        // Too few taps or channels.
        assert!(!suits(768, 768, 3, M));
        assert!(!suits(768, 768, 1, M));
        assert!(!suits(31, 768, 7, M));
        assert!(!suits(1, 96, 7, M));
        // Its upsamplers (cin, cout, k, stride): the two smaller ones; blocks 1 and 2's weights would grow by
        // 190 and 30 MB; the pre-vocoder's k = stride ones have one tap per phase.
        assert!(suits_transposed(384, 192, 8, 4));
        assert!(suits_transposed(192, 96, 6, 3));
        assert!(!suits_transposed(768, 384, 10, 5));
        assert!(!suits_transposed(1536, 768, 16, 8));
        assert!(!suits_transposed(1024, 1024, 2, 2));
    }

    #[test]
    fn threads_and_chunks_do_not_change_a_bit() {
        // Many chunks side by side (2000 columns), and a narrow call: one chunk, its GEMMs on every thread.
        for (len, d) in [(2000, 3), (6 + 4, 1), (18 + 40, 3)] {
            let (cout, cin, k) = (48, 40, 7);
            let w = random(cout * cin * k, 4);
            let x = random(cin * len, 5);
            let conv =
                ConvWeight::winograd(&w, (cout, cin, k), None, WeightFormat::F32, Layout::Gemm, M);
            let run = |par| {
                let mut y = vec![0.0; cout * (len - (k - 1) * d)];
                conv.forward(&x, len, d, &mut y, par);
                y
            };
            let one = run(gemm::Parallelism::None);
            assert_eq!(one, run(gemm::Parallelism::Rayon(2)), "{len} columns");
            assert_eq!(one, run(gemm::Parallelism::Rayon(3)), "{len} columns");
        }
    }
}
