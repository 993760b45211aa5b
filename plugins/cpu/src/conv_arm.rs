//! The convolutions' tap GEMMs on aarch64 as one NEON micro-kernel (ARM.md).
//!
//! A tile of 8 output channels × 12 output columns is held in 24 `f32` accumulator registers while every tap
//! and every input channel is added into it (`FMLA` by element, 24 per input channel and tap), starting from the
//! bias, and is stored once: no pass over the output per tap, and no bias pass. Weights are blocked at upload as
//! `[cout/8][k][cin][8]` (the last block padded with zero rows), so each input channel's 8 weights are one
//! 32-byte (F32) or 16-byte (F16) load; F16 weights are widened in registers (`FCVTL`/`FCVTL2`, ARMv8.0), so
//! there is no widening pass and no scratch buffer.
//!
//! The arithmetic is `f32`, as in the official implementation. Every output is a fixed sum whatever the threads or
//! tiling: per tap in order, the input channels in blocks of `conv::BLOCK_TERMS`, each block one fused
//! multiply-add chain from zero, added in order to the bias and the blocks before it (the twin of `conv_x86.rs`,
//! whose reason holds here too). The F16 widening is exact, so an F16 layer equals the F32 one on the rounded
//! weights bit for bit.
//!
//! `KAZEIA_ARM_CONV=gemm` keeps the `gemm` crate's path (the `Panels` of `conv.rs`) instead, to compare.

use std::arch::aarch64::*;
use std::sync::OnceLock;

use half::f16;
use kazeia_backend_abi::WeightFormat;

use crate::conv::{channels_per_block, source_index, Stored};
use crate::gemm_call::{for_tile_blocks, Dst, SharedOut};

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

/// Tap weights blocked for the tile kernel: `[cout/8][k][cin][8]`.
pub struct Blocked {
    data: Stored,
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
        Blocked {
            data: Stored::new(n, (0..n).map(at), format),
            cout,
            cin,
            k,
        }
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
                Stored::F32(w) => tile(w[block].as_ptr(), self.cin, x, len, taps, init, dst),
                Stored::F16(w) => tile(w[block].as_ptr(), self.cin, x, len, taps, init, dst),
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
    for_tile_blocks((lout, TIME_TILE), (cout, MR), par, |cols, ob, outs| {
        let (o0, rows) = (outs.start, outs.len());
        let mut init = [0.0; MR];
        init[..rows].copy_from_slice(&bias[outs]);
        for c in cols.clone().step_by(NR) {
            let taps = (0..k).map(|t| (t, (c + t * dilation) as isize));
            // SAFETY: the tile is output rows o0..o0+rows × columns c..c+cols of `y[cout][lout]`: time tiles
            // and row blocks are disjoint, so no other thread writes it.
            unsafe {
                let dst = Dst::new(out, o0 * lout + c, (rows, (cols.end - c).min(NR)), lout, 1);
                w.tile(ob, x, len, taps, &init, &dst);
            }
        }
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
    for_tile_blocks(
        (lfull.div_ceil(s), TIME_TILE),
        (cout, MR),
        par,
        |ms, ob, outs| {
            let (o0, rows) = (outs.start, outs.len());
            for r in 0..s {
                let taps = k.saturating_sub(r).div_ceil(s);
                let end = ms.end.min(lfull.saturating_sub(r).div_ceil(s));
                for m in (ms.start..end).step_by(NR) {
                    // y[o][m·s + r] += w[r + j·s] · x[m − j]; `tile` reads columns outside 0..len as zeros.
                    let taps = (0..taps).map(|j| (r + j * s, m as isize - j as isize));
                    // SAFETY: the tile is output rows o0..o0+rows × positions m..m+cols of phase r: time tiles,
                    // row blocks and phases are disjoint, so no other thread writes it.
                    unsafe {
                        let dst = Dst::new(
                            out,
                            o0 * lfull + m * s + r,
                            (rows, (end - m).min(NR)),
                            lfull,
                            s,
                        );
                        w.tile(ob, x, len, taps, &[0.0; MR], &dst);
                    }
                }
            }
        },
    );
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
/// `w` must hold 8 weights for each of `channels`.
#[inline(always)]
unsafe fn add_edge_tap<W: Widen>(
    acc: &mut Acc,
    w: *const W,
    x: &[f32],
    len: usize,
    channels: std::ops::Range<usize>,
    col: isize,
) {
    let lo = (-col).clamp(0, NR as isize) as usize;
    let hi = (len as isize - col).clamp(0, NR as isize) as usize;
    if lo >= hi {
        return;
    }
    let mut lanes = [0u32; NR];
    lanes[lo..hi].fill(!0);
    // SAFETY: the weight loads stay within the channels' groups (the contract); the vector loads from `x` are
    // checked to lie inside it, the others read the local copy; NEON is part of the aarch64 baseline.
    unsafe {
        let mask = |v: usize| vld1q_u32(lanes[4 * v..].as_ptr());
        let masks = [mask(0), mask(1), mask(2)];
        for i in channels {
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
        // The bias, then each block's sum (`conv::BLOCK_TERMS` products into fresh accumulators): kept in memory,
        // since the accumulators fill the registers.
        let mut total = [[0.0f32; NR]; MR];
        for (row, &b) in total.iter_mut().zip(init) {
            row.fill(b);
        }
        let block = channels_per_block(1);
        for (tap, col) in taps {
            let w = w.add(tap * cin * MR);
            let inside = col >= 0 && col as usize + NR <= len;
            let mut first = 0;
            while first < cin {
                let end = (first + block).min(cin);
                let mut acc: Acc = [[vdupq_n_f32(0.0); 3]; MR];
                if inside {
                    let x = x.as_ptr().add(first * len + col as usize);
                    add_tap(&mut acc, w.add(first * MR), x, len, end - first);
                } else {
                    add_edge_tap(&mut acc, w, x, len, first..end, col);
                }
                for (row, a) in total.iter_mut().zip(&acc) {
                    for (v, &a) in a.iter().enumerate() {
                        let p = row.as_mut_ptr().add(4 * v);
                        vst1q_f32(p, vaddq_f32(vld1q_f32(p), a));
                    }
                }
                first = end;
            }
        }
        let acc: Acc = std::array::from_fn(|r| {
            std::array::from_fn(|v| vld1q_f32(total[r].as_ptr().add(4 * v)))
        });
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
    use crate::conv::tests::{
        tile_conv1d_matches_the_exact_sum, tile_conv_transpose1d_matches_the_exact_sum,
        tile_f16_is_f32_on_rounded_weights_bit_for_bit, tile_long_sums_are_blocked, TileShape,
    };
    use crate::conv::Layout;

    const TILE: TileShape = TileShape {
        rows: MR,
        cols: NR,
        time_tile: TIME_TILE,
    };

    #[test]
    fn neon_conv1d_matches_the_exact_sum() {
        tile_conv1d_matches_the_exact_sum(Layout::Neon, TILE);
    }

    #[test]
    fn neon_conv_transpose1d_matches_the_exact_sum() {
        tile_conv_transpose1d_matches_the_exact_sum(Layout::Neon, TILE);
    }

    #[test]
    fn neon_long_sums_are_blocked() {
        tile_long_sums_are_blocked(Layout::Neon, TILE);
    }

    #[test]
    fn neon_f16_is_f32_on_rounded_weights_bit_for_bit() {
        tile_f16_is_f32_on_rounded_weights_bit_for_bit(Layout::Neon);
    }

    #[test]
    fn the_neon_kernel_is_in_use_unless_capped() {
        let capped = std::env::var("KAZEIA_ARM_CONV").as_deref() == Ok("gemm");
        assert_eq!(selected(), if capped { Kernel::Gemm } else { Kernel::Neon });
    }
}
