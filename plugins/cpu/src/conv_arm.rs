//! The convolutions' tap GEMMs on aarch64 as one NEON micro-kernel (ARM.md).
//!
//! A tile of 8 output channels × 12 output columns is held in 24 `f32` accumulator registers while every tap
//! and every input channel is added into it (`FMLA` by element, 24 per input channel and tap), starting from the
//! bias, and is stored once: no pass over the output per tap, and no bias pass. Weights are blocked at upload as
//! `[cout/8][k][cin][8]` (the last block padded with zero rows), so each input channel's 8 weights are one
//! 32-byte (F32) or 16-byte (F16) load; F16 weights are widened in registers (`FCVTL`/`FCVTL2`, ARMv8.0), so
//! there is no widening pass and no scratch buffer.
//!
//! The arithmetic is `f32`, as in the official implementation. Every output is one fused multiply-add chain in a
//! fixed order (bias, then taps in order, input channels in order) whatever the threads or tiling, and the F16
//! widening is exact, so an F16 layer equals the F32 one on the rounded weights bit for bit.
//!
//! `KAZEIA_ARM_CONV=gemm` keeps the `gemm` crate's path (the `Panels` of `conv.rs`) instead, to compare.

use std::arch::aarch64::*;
use std::sync::OnceLock;

use half::f16;
use kazeia_backend_abi::WeightFormat;
use rayon::prelude::*;

use crate::conv::source_index;
use crate::gemm_call::{for_column_tiles, SharedOut};

/// Output channels per tile: two q-registers of weights per input channel.
const MR: usize = 8;
/// Output columns per tile: three q-registers of inputs; 8 × 3 accumulators + 2 + 3 leave 3 of 32 registers.
const NR: usize = 12;
/// Columns per time tile (a unit of parallel work): a multiple of `NR`, so only a call's last tile is partial.
const TIME_TILE: usize = 20 * NR;

/// The convolution kernels on aarch64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// This module's tile kernel.
    Neon,
    /// The `gemm` crate's NEON micro-kernels on `f32` tap panels (`f16` ones widened first).
    Gemm,
}

/// The kernel in use: the NEON tile, unless `KAZEIA_ARM_CONV=gemm`.
pub fn selected() -> Kernel {
    static SELECTED: OnceLock<Kernel> = OnceLock::new();
    *SELECTED.get_or_init(|| match std::env::var("KAZEIA_ARM_CONV").as_deref() {
        Ok("gemm") => Kernel::Gemm,
        _ => Kernel::Neon,
    })
}

enum Data {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

/// Tap weights blocked for the tile kernel: `[cout/8][k][cin][8]`.
pub struct Blocked {
    data: Data,
    cout: usize,
    cin: usize,
    k: usize,
}

impl Blocked {
    /// Blocks `w[cout][cin][k]` (or, transposed, `w[cin][cout][k]`), stored as `format` (F32 or F16).
    pub fn new(
        w: &[f32],
        (cout, cin, k): (usize, usize, usize),
        transposed: bool,
        format: WeightFormat,
    ) -> Self {
        let at = |j: usize| {
            let (r, i, t, ob) = (j % MR, j / MR % cin, j / (MR * cin) % k, j / (MR * cin * k));
            let o = ob * MR + r;
            if o < cout {
                w[source_index(o, i, t, (cout, cin, k), transposed)]
            } else {
                0.0
            }
        };
        let n = cout.div_ceil(MR) * k * cin * MR;
        let data = match format {
            WeightFormat::F16 => Data::F16((0..n).map(|j| f16::from_f32(at(j))).collect()),
            WeightFormat::F32 => Data::F32((0..n).map(at).collect()),
            other => panic!("a convolution stored as {other} (the ABI's check admits f32 and f16)"),
        };
        Blocked { data, cout, cin, k }
    }

    /// One tile of row block `ob` (see [`tile`]).
    ///
    /// # Safety
    /// `dst` must be a tile no other thread accesses.
    unsafe fn tile(
        &self,
        ob: usize,
        x: &[f32],
        len: usize,
        taps: impl Iterator<Item = (usize, isize)>,
        init: &[f32; MR],
        dst: &Dst,
    ) {
        let size = self.k * self.cin * MR;
        let block = ob * size..(ob + 1) * size;
        let k = self.k;
        let taps = taps.inspect(|&(tap, _)| assert!(tap < k, "tap {tap} of {k}"));
        // SAFETY: the slice is row block `ob`'s `k · cin · MR` weights (indexing checks that the block exists)
        // and the taps are `< k` (checked as they are used); `dst` is this function's contract.
        unsafe {
            match &self.data {
                Data::F32(w) => tile(w[block].as_ptr(), self.cin, x, len, taps, init, dst),
                Data::F16(w) => tile(w[block].as_ptr(), self.cin, x, len, taps, init, dst),
            }
        }
    }
}

/// Valid dilated convolution (see [`crate::ConvWeight::forward`]); the caller checked the sizes.
pub fn conv1d(
    w: &Blocked,
    bias: &[f32],
    x: &[f32],
    len: usize,
    dilation: usize,
    y: &mut [f32],
    par: gemm::Parallelism,
) {
    let (cout, k) = (w.cout, w.k);
    let lout = len - (k - 1) * dilation;
    let out = SharedOut::new(y);
    for_column_tiles(lout, TIME_TILE, par, |c0, c1, par| {
        row_blocks(cout, par, |ob| {
            let (o0, rows) = (ob * MR, (cout - ob * MR).min(MR));
            let mut init = [0.0; MR];
            init[..rows].copy_from_slice(&bias[o0..o0 + rows]);
            for c in (c0..c1).step_by(NR) {
                let taps = (0..k).map(|t| (t, (c + t * dilation) as isize));
                // SAFETY: the tile is output rows o0..o0+rows × columns c..c+cols of `y[cout][lout]`: time tiles
                // and row blocks are disjoint, so no other thread writes it.
                unsafe {
                    let dst = Dst::new(out, o0 * lout + c, rows, (c1 - c).min(NR), lout, 1);
                    w.tile(ob, x, len, taps, &init, &dst);
                }
            }
        });
    });
}

/// Full transposed convolution (see [`crate::ConvTransposeWeight::forward`]); the caller checked the sizes.
/// Each output phase `r` is a sum over its taps `r + j·stride` into the columns `m·stride + r`; every column of
/// `y` is written once (phases without taps get zeros).
pub fn conv_transpose1d(
    w: &Blocked,
    stride: usize,
    x: &[f32],
    len: usize,
    y: &mut [f32],
    par: gemm::Parallelism,
) {
    let (cout, k, s) = (w.cout, w.k, stride);
    let lfull = (len - 1) * s + k;
    let out = SharedOut::new(y);
    for_column_tiles(lfull.div_ceil(s), TIME_TILE, par, |m0, m1, par| {
        row_blocks(cout, par, |ob| {
            let (o0, rows) = (ob * MR, (cout - ob * MR).min(MR));
            for r in 0..s {
                let taps = k.saturating_sub(r).div_ceil(s);
                let end = m1.min(lfull.saturating_sub(r).div_ceil(s));
                for m in (m0..end).step_by(NR) {
                    // y[o][m·s + r] += w[r + j·s] · x[m − j]; `tile` reads columns outside 0..len as zeros.
                    let taps = (0..taps).map(|j| (r + j * s, m as isize - j as isize));
                    // SAFETY: the tile is output rows o0..o0+rows × positions m..m+cols of phase r: time tiles,
                    // row blocks and phases are disjoint, so no other thread writes it.
                    unsafe {
                        let dst = Dst::new(
                            out,
                            o0 * lfull + m * s + r,
                            rows,
                            (end - m).min(NR),
                            lfull,
                            s,
                        );
                        w.tile(ob, x, len, taps, &[0.0; MR], &dst);
                    }
                }
            }
        });
    });
}

/// Calls `f(ob)` for each row block of `cout` outputs: on the pool when `par` has threads.
fn row_blocks(cout: usize, par: gemm::Parallelism, f: impl Fn(usize) + Sync + Send) {
    let blocks = cout.div_ceil(MR);
    match par {
        gemm::Parallelism::Rayon(n) if n > 1 && blocks > 1 => {
            (0..blocks).into_par_iter().for_each(f)
        }
        _ => (0..blocks).for_each(f),
    }
}

/// Where a tile goes: `rows × cols` elements from `ptr`, element `(o, c)` at `o·row_stride + c·col_stride`.
struct Dst {
    ptr: *mut f32,
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl Dst {
    /// # Safety
    /// No other thread may access the tile's elements while it is written.
    unsafe fn new(
        out: SharedOut,
        offset: usize,
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    ) -> Self {
        let (ptr, len) = out.raw_parts();
        assert!(
            (1..=MR).contains(&rows) && (1..=NR).contains(&cols),
            "conv tile shape"
        );
        let last = offset + (rows - 1) * row_stride + (cols - 1) * col_stride;
        assert!(last < len, "conv tile out of bounds: {last} of {len}");
        Dst {
            ptr: ptr.wrapping_add(offset),
            rows,
            cols,
            row_stride,
            col_stride,
        }
    }
}

/// 8 rows × 3 vectors of 4 columns.
type Acc = [[float32x4_t; 3]; MR];

/// A weight element the kernel widens to `f32` in registers.
trait Widen {
    /// The 8 weights at `p`, as `f32`.
    ///
    /// # Safety
    /// `p..p + 8` must be readable.
    unsafe fn load8(p: *const Self) -> (float32x4_t, float32x4_t);
}

impl Widen for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> (float32x4_t, float32x4_t) {
        // SAFETY: 8 readable values (this function's contract); NEON is part of the aarch64 baseline.
        unsafe { (vld1q_f32(p), vld1q_f32(p.add(4))) }
    }
}

impl Widen for f16 {
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> (float32x4_t, float32x4_t) {
        // SAFETY: 8 readable halves (this function's contract; `f16` is a transparent `u16`); NEON, and its
        // f16 → f32 conversion (`FCVTL`), are part of the aarch64 baseline.
        unsafe {
            let v = vld1q_u16(p.cast::<u16>());
            // SAFETY: same size; the bits are IEEE halves.
            let lo: float16x4_t = std::mem::transmute(vget_low_u16(v));
            (
                vcvt_f32_f16(lo),
                vcvt_high_f32_f16(std::mem::transmute::<uint16x8_t, float16x8_t>(v)),
            )
        }
    }
}

/// `acc[r][v] += xs[v] · w[r]` for the 8 weights `w0 ‖ w1`: 24 `FMLA` by element.
#[inline(always)]
fn fma_tile(acc: &mut Acc, w0: float32x4_t, w1: float32x4_t, xs: [float32x4_t; 3]) {
    // SAFETY: NEON is part of the aarch64 baseline; no memory is touched.
    unsafe {
        for v in 0..3 {
            acc[0][v] = vfmaq_laneq_f32::<0>(acc[0][v], xs[v], w0);
            acc[1][v] = vfmaq_laneq_f32::<1>(acc[1][v], xs[v], w0);
            acc[2][v] = vfmaq_laneq_f32::<2>(acc[2][v], xs[v], w0);
            acc[3][v] = vfmaq_laneq_f32::<3>(acc[3][v], xs[v], w0);
            acc[4][v] = vfmaq_laneq_f32::<0>(acc[4][v], xs[v], w1);
            acc[5][v] = vfmaq_laneq_f32::<1>(acc[5][v], xs[v], w1);
            acc[6][v] = vfmaq_laneq_f32::<2>(acc[6][v], xs[v], w1);
            acc[7][v] = vfmaq_laneq_f32::<3>(acc[7][v], xs[v], w1);
        }
    }
}

/// The inner loop: one tap over all `cin` input channels, columns `x[i][0..NR]` (row stride `len`).
///
/// # Safety
/// `w` must hold `cin · 8` weights and `x` point at `NR` readable values in each of `cin` rows `len` apart.
#[inline(always)]
unsafe fn add_tap<W: Widen>(acc: &mut Acc, w: *const W, x: *const f32, len: usize, cin: usize) {
    // SAFETY: the loads stay within the `cin` weight groups and the `cin` rows' `NR` values (the contract).
    unsafe {
        for i in 0..cin {
            let (w0, w1) = W::load8(w.add(i * MR));
            let p = x.add(i * len);
            fma_tile(
                acc,
                w0,
                w1,
                [vld1q_f32(p), vld1q_f32(p.add(4)), vld1q_f32(p.add(8))],
            );
        }
    }
}

/// A tap whose columns `col..col + NR` of `x[cin][len]` are not all inside `0..len` (a call's edges): the
/// columns outside read as zeros. Rows whose 12 values lie inside `x` are loaded as they are and masked; the
/// first and last rows, whose window may leave the buffer, go through a zeroed copy.
///
/// Inlined: a call would take the accumulators' address and send them through memory between all taps.
///
/// # Safety
/// `w` must hold `cin · 8` weights.
#[inline(always)]
unsafe fn add_edge_tap<W: Widen>(
    acc: &mut Acc,
    w: *const W,
    x: &[f32],
    len: usize,
    cin: usize,
    col: isize,
) {
    let lo = (-col).clamp(0, NR as isize) as usize;
    let hi = (len as isize - col).clamp(0, NR as isize) as usize;
    if lo >= hi {
        return;
    }
    let mut lanes = [0u32; NR];
    lanes[lo..hi].fill(!0);
    // SAFETY: the weight loads stay within the `cin` groups (the contract); the vector loads from `x` are
    // checked to lie inside it, the others read the local copy; NEON is part of the aarch64 baseline.
    unsafe {
        let mask = |v: usize| vld1q_u32(lanes[4 * v..].as_ptr());
        let masks = [mask(0), mask(1), mask(2)];
        for i in 0..cin {
            let (w0, w1) = W::load8(w.add(i * MR));
            let first = (i * len) as isize + col;
            let xs = if first >= 0 && first as usize + NR <= x.len() {
                let p = x.as_ptr().add(first as usize);
                [0, 1, 2].map(|v| {
                    let raw = vreinterpretq_u32_f32(vld1q_f32(p.add(4 * v)));
                    vreinterpretq_f32_u32(vandq_u32(raw, masks[v]))
                })
            } else {
                let mut copy = [0.0f32; NR];
                let from = (first + lo as isize) as usize;
                copy[lo..hi].copy_from_slice(&x[from..from + (hi - lo)]);
                [0, 1, 2].map(|v| vld1q_f32(copy[4 * v..].as_ptr()))
            };
            fma_tile(acc, w0, w1, xs);
        }
    }
}

/// One tile: `init` (the bias) plus, for each `(tap, col)`, tap `tap`'s weights times columns `col..col + NR` of
/// `x[cin][len]` (columns outside `0..len` count as zeros), stored to `dst`.
///
/// # Safety
/// `w` must hold `cin · 8` weights for each tap named; `dst` must be a tile no other thread accesses.
#[inline(never)]
unsafe fn tile<W: Widen>(
    w: *const W,
    cin: usize,
    x: &[f32],
    len: usize,
    taps: impl Iterator<Item = (usize, isize)>,
    init: &[f32; MR],
    dst: &Dst,
) {
    // SAFETY: NEON is part of the aarch64 baseline; the taps' weights are in `w` (the contract), and the inner
    // loop's columns lie inside `x`'s rows when `0 ≤ col` and `col + NR ≤ len`, else the edge path checks them.
    unsafe {
        let mut acc: Acc = init.map(|b| [vdupq_n_f32(b); 3]);
        for (tap, col) in taps {
            let w = w.add(tap * cin * MR);
            if col >= 0 && col as usize + NR <= len {
                add_tap(&mut acc, w, x.as_ptr().add(col as usize), len, cin);
            } else {
                add_edge_tap(&mut acc, w, x, len, cin, col);
            }
        }
        store(&acc, dst);
    }
}

/// # Safety
/// As for [`tile`]'s `dst`.
#[inline(always)]
unsafe fn store(acc: &Acc, d: &Dst) {
    // SAFETY: `Dst::new` checked that the tile's `rows × cols` elements lie in the output, which no other thread
    // accesses (the contract); NEON is part of the aarch64 baseline.
    unsafe {
        if d.rows == MR && d.cols == NR && d.col_stride == 1 {
            for (r, row) in acc.iter().enumerate() {
                let p = d.ptr.add(r * d.row_stride);
                for (v, &a) in row.iter().enumerate() {
                    vst1q_f32(p.add(4 * v), a);
                }
            }
        } else {
            // Partial tiles and the transposed convolutions' strided columns: through a copy.
            let mut t = [[0.0f32; NR]; MR];
            for (row, a) in t.iter_mut().zip(acc) {
                for (v, &a) in a.iter().enumerate() {
                    vst1q_f32(row[4 * v..].as_mut_ptr(), a);
                }
            }
            for (r, row) in t.iter().enumerate().take(d.rows) {
                let p = d.ptr.add(r * d.row_stride);
                for (c, &v) in row.iter().enumerate().take(d.cols) {
                    *p.add(c * d.col_stride) = v;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::tests::{rounded, values};
    use crate::conv::{ConvTransposeWeight, ConvWeight, Layout};

    /// `n · u / (1 − n · u)` (u = 2⁻²⁴): the relative bound of an `n`-term `f32` sum, fused or not, in any order.
    fn gamma(n: usize) -> f64 {
        let nu = n as f64 * f64::from(f32::EPSILON) / 2.0;
        nu / (1.0 - nu)
    }

    /// Checks `y` against the exact sums `exact[o]` (f64) with the bound `γ(terms) · Σ|term|` of each output.
    fn check(y: &[f32], exact: &[(f64, f64, usize)], what: &str) {
        for (n, (&got, &(sum, abs, terms))) in y.iter().zip(exact).enumerate() {
            let bound = gamma(terms) * abs;
            let err = (f64::from(got) - sum).abs();
            assert!(
                err <= bound,
                "{what}: output {n} is {got}, exact {sum}: error {err:e} > bound {bound:e}"
            );
        }
    }

    /// `(Σ, Σ|·|, terms)` of each output of the dilated convolution, from the definition.
    fn conv1d_exact(
        w: &[f32],
        bias: &[f32],
        x: &[f32],
        (cout, cin, k): (usize, usize, usize),
        len: usize,
        dilation: usize,
    ) -> Vec<(f64, f64, usize)> {
        let lout = len - (k - 1) * dilation;
        let mut out = Vec::new();
        for o in 0..cout {
            for c in 0..lout {
                let (mut s, mut a) = (f64::from(bias[o]), f64::from(bias[o]).abs());
                for i in 0..cin {
                    for t in 0..k {
                        let p = f64::from(w[(o * cin + i) * k + t])
                            * f64::from(x[i * len + c + t * dilation]);
                        s += p;
                        a += p.abs();
                    }
                }
                out.push((s, a, cin * k + 1));
            }
        }
        out
    }

    /// The same for the transposed convolution: `y[o][n] = Σ_{i, t: n = m·s + t} w[i][o][t] · x[i][m]`.
    fn conv_transpose1d_exact(
        w: &[f32],
        x: &[f32],
        (cin, cout, k): (usize, usize, usize),
        stride: usize,
        len: usize,
    ) -> Vec<(f64, f64, usize)> {
        let lfull = (len - 1) * stride + k;
        let mut out = vec![(0.0, 0.0, 1); cout * lfull];
        for o in 0..cout {
            for i in 0..cin {
                for m in 0..len {
                    for t in 0..k {
                        let p = f64::from(w[(i * cout + o) * k + t]) * f64::from(x[i * len + m]);
                        let e = &mut out[o * lfull + m * stride + t];
                        e.0 += p;
                        e.1 += p.abs();
                        e.2 += 1;
                    }
                }
            }
        }
        out
    }

    fn parallelisms() -> [gemm::Parallelism; 2] {
        [gemm::Parallelism::None, gemm::Parallelism::Rayon(2)]
    }

    /// Output filled with NaN first, so that a tile left unwritten fails the check.
    fn unwritten(n: usize) -> Vec<f32> {
        vec![f32::NAN; n]
    }

    /// Runs `forward(y, par)` into `n` outputs filled with NaN first (so that a tile left unwritten fails the
    /// check) with one and two threads: each result within the bound of `exact`, and the same bits both ways.
    fn check_with_every_parallelism(
        n: usize,
        exact: &[(f64, f64, usize)],
        what: &str,
        forward: impl Fn(&mut [f32], gemm::Parallelism),
    ) {
        let mut first = None;
        for par in parallelisms() {
            let mut y = unwritten(n);
            forward(&mut y, par);
            let what = format!("{what} {par:?}");
            check(&y, exact, &what);
            let bits: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
            assert_eq!(
                *first.get_or_insert(bits.clone()),
                bits,
                "{what}: threads change the bits"
            );
        }
    }

    /// Awkward dilated convolutions: `cout` and `cin` off the 8-row block, outputs shorter than a tile and off
    /// the 12-column tile, k = 1, dilations up to 9, several time tiles (and the tile-parallel branch with 2
    /// threads); F32 and F16 weights, 1 and 2 threads.
    #[test]
    fn neon_conv1d_matches_the_exact_sum() {
        let shapes = [
            // cout, cin, k, dilation, len
            (1, 1, 1, 1, 1),
            (1, 3, 7, 1, 7),
            (8, 8, 1, 1, 12),
            (9, 5, 3, 2, 17),
            (7, 19, 7, 9, 67),
            (17, 33, 5, 3, 25),
            (16, 16, 7, 1, 13 + 6),
            (24, 10, 3, 1, 4 * TIME_TILE + 13),
            (3, 2, 2, 5, 2 * TIME_TILE + 5),
        ];
        for (cout, cin, k, dilation, len) in shapes {
            let w = values(cout * cin * k, 11, 0.5);
            let bias = values(cout, 12, 0.5);
            let x = values(cin * len, 13, 1.0);
            let lout = len - (k - 1) * dilation;
            for (format, weights) in [
                (WeightFormat::F32, w.clone()),
                (WeightFormat::F16, rounded(&w)),
            ] {
                let layer =
                    ConvWeight::with_layout(&w, (cout, cin, k), Some(&bias), format, Layout::Neon);
                let exact = conv1d_exact(&weights, &bias, &x, (cout, cin, k), len, dilation);
                let what = format!("conv1d {cout}×{cin}×{k} d{dilation} len {len} {format}");
                check_with_every_parallelism(cout * lout, &exact, &what, |y, par| {
                    layer.forward(&x, len, dilation, y, par)
                });
            }
        }
    }

    /// Awkward transposed convolutions: stride < k (the decoder's 2·stride), stride = k, stride > k (phases
    /// without taps), k = 1, one input column, outputs off the tiles, several time tiles.
    #[test]
    fn neon_conv_transpose1d_matches_the_exact_sum() {
        let shapes = [
            // cin, cout, k, stride, len
            (1, 1, 1, 1, 1),
            (5, 9, 16, 8, 1),
            (3, 7, 4, 2, 13),
            (11, 17, 3, 5, 7),
            (4, 8, 10, 5, 30),
            (6, 3, 2, 2, 100),
            (13, 16, 7, 3, 29),
            (5, 6, 1, 1, 20),
            (7, 9, 6, 3, 3 * TIME_TILE + 7),
            // a tile whose last column reads x just past a row end (len + j ≡ 11 mod 12) into a stored output
            (4, 9, 6, 2, 23),
            (5, 10, 16, 8, 35),
        ];
        for (cin, cout, k, stride, len) in shapes {
            let w = values(cin * cout * k, 21, 0.5);
            let x = values(cin * len, 22, 1.0);
            let lfull = (len - 1) * stride + k;
            for (format, weights) in [
                (WeightFormat::F32, w.clone()),
                (WeightFormat::F16, rounded(&w)),
            ] {
                let layer = ConvTransposeWeight::with_layout(
                    &w,
                    (cin, cout, k),
                    stride,
                    format,
                    Layout::Neon,
                );
                let exact = conv_transpose1d_exact(&weights, &x, (cin, cout, k), stride, len);
                let what =
                    format!("conv_transpose1d {cin}×{cout}×{k} s{stride} len {len} {format}");
                check_with_every_parallelism(cout * lfull, &exact, &what, |y, par| {
                    layer.forward(&x, len, y, par)
                });
            }
        }
    }

    /// F16 weights are widened exactly and run through the same chain of fused multiply-adds, so an F16 layer
    /// equals the F32 one on the rounded weights bit for bit (not merely within rounding).
    #[test]
    fn neon_f16_is_f32_on_rounded_weights_bit_for_bit() {
        let (cout, cin, k) = (19, 21, 7);
        let w = values(cout * cin * k, 31, 0.5);
        let bias = values(cout, 32, 0.5);
        let len = 100;
        let x = values(cin * len, 33, 1.0);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let half = Blocked::new(&w, (cout, cin, k), false, WeightFormat::F16);
        let full = Blocked::new(&rounded(&w), (cout, cin, k), false, WeightFormat::F32);
        let lout = len - (k - 1) * 3;
        let (mut a, mut b) = (unwritten(cout * lout), unwritten(cout * lout));
        conv1d(&half, &bias, &x, len, 3, &mut a, gemm::Parallelism::None);
        conv1d(&full, &bias, &x, len, 3, &mut b, gemm::Parallelism::None);
        assert_eq!(bits(&a), bits(&b), "conv1d");
        let (cin, cout, stride) = (cout, cin, 4);
        let half = Blocked::new(&w, (cout, cin, k), true, WeightFormat::F16);
        let full = Blocked::new(&rounded(&w), (cout, cin, k), true, WeightFormat::F32);
        let lfull = (len - 1) * stride + k;
        let (mut a, mut b) = (unwritten(cout * lfull), unwritten(cout * lfull));
        conv_transpose1d(
            &half,
            stride,
            &x[..cin * len],
            len,
            &mut a,
            gemm::Parallelism::None,
        );
        conv_transpose1d(
            &full,
            stride,
            &x[..cin * len],
            len,
            &mut b,
            gemm::Parallelism::None,
        );
        assert_eq!(bits(&a), bits(&b), "conv_transpose1d");
    }

    #[test]
    fn the_neon_kernel_is_in_use_unless_capped() {
        let capped = std::env::var("KAZEIA_ARM_CONV").as_deref() == Ok("gemm");
        assert_eq!(selected(), if capped { Kernel::Gemm } else { Kernel::Neon });
    }
}
