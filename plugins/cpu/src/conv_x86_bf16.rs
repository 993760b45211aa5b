//! The fast decoder's convolutions on x86-64 with AVX512-BF16: the tap GEMMs of `conv_x86.rs`'s AVX-512 tile on
//! bf16 dot products (`vdpbf16ps`, two products per 32-bit lane: twice the f32 FMA rate), an opt-in that is not
//! exact ([`crate::CpuBackend::with_fast_convolutions`]).
//!
//! Inputs and weights are rounded to bf16 (8 significant bits, round to nearest even); their products are exact
//! in f32 and are summed in f32, in the exact kernel's blocks of ~`conv::BLOCK_TERMS` products added in order to
//! the bias. So the error is the rounding of the operands (a relative ~2⁻⁹ each), not of the sums: against the
//! scalar sum of the rounded operands the kernel is within the f32 bound (the tests). Input channels are paired
//! per lane: weights are blocked at upload as `[cout/32][group][cin/2][taps][32]` pairs (channel `2p` in the low
//! half, `2p + 1` in the high one; an odd `cin` padded with a zero channel), and the input is converted once per
//! call (a transposed conv's once per time tile, with its zeros past the ends) to rows of pairs `[cin/2][cols]`,
//! so one pair of channels at one column is one broadcast. The tile is the exact kernel's: 32 output channels ×
//! 14 columns in 28 zmm accumulators, stored through its transpose; groups, tiles and the schedule are its too.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;
use std::sync::OnceLock;

use crate::conv::{channels_per_block, source_index};
use crate::conv_x86::{
    tiles, Avx512, Simd, MAX_ROWS, PREFETCH_BYTES, TIME_TILE_TILES as TILES_PER_TIME_TILE,
};
use crate::gemm_call::{for_column_tiles, for_row_blocks, for_tile_blocks, Dst, SharedOut};
use crate::par::chunks_mut;

/// Output channels per tile (two zmm of 16 lanes).
const ROWS: usize = 32;
/// Output columns per tile.
const COLS: usize = 14;

/// Whether this CPU has the kernel (AVX512-BF16 and the AVX-512F the tile stores with).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
    })
}

/// `v` rounded to bf16 (to nearest, ties to even), as the bits of the bf16 (the high half of the f32's).
#[inline(always)]
pub(crate) fn bf16_bits(v: f32) -> u32 {
    let b = v.to_bits();
    if v.is_nan() {
        // Quiet, keeping the sign and the top of the payload.
        (b >> 16) | 0x40
    } else {
        (b + 0x7fff + ((b >> 16) & 1)) >> 16
    }
}

/// Two values as one lane of bf16 pairs: `lo` in the low half.
#[inline(always)]
fn pair(lo: f32, hi: f32) -> u32 {
    bf16_bits(lo) | (bf16_bits(hi) << 16)
}

/// Tap weights blocked for the bf16 tile: `[cout/32][group][cin/2][taps of the group][32]` pairs.
pub struct Blocked {
    data: Vec<u32>,
    cout: usize,
    cin: usize,
    k: usize,
    /// Group `g` holds `starts[g + 1] − starts[g]` taps (as in `conv_x86::Blocked`).
    starts: Vec<usize>,
}

impl Blocked {
    /// Blocks `w[cout][cin][k]` (or, with a `stride`, the transposed `w[cin][cout][k]` by output phase) as bf16
    /// pairs of input channels.
    pub fn new(w: &[f32], (cout, cin, k): (usize, usize, usize), stride: Option<usize>) -> Self {
        assert!(
            available(),
            "the bf16 convolution on a CPU without AVX512-BF16"
        );
        let groups: Vec<Vec<usize>> = match stride {
            None => vec![(0..k).collect()],
            Some(s) => (0..s).map(|r| (r..k).step_by(s).collect()).collect(),
        };
        let starts = std::iter::once(0)
            .chain(groups.iter().scan(0, |n, g| {
                *n += g.len();
                Some(*n)
            }))
            .collect();
        let dims = (cout, cin, k);
        let weight = |o: usize, i: usize, t: usize| {
            if o < cout && i < cin {
                w[source_index(o, i, t, dims, stride.is_some())]
            } else {
                0.0
            }
        };
        let (blocks, pairs) = (cout.div_ceil(ROWS), cin.div_ceil(2));
        let mut data = Vec::with_capacity(blocks * k * pairs * ROWS);
        for ob in 0..blocks {
            for taps in &groups {
                for p in 0..pairs {
                    for &t in taps {
                        for o in ob * ROWS..(ob + 1) * ROWS {
                            data.push(pair(weight(o, 2 * p, t), weight(o, 2 * p + 1, t)));
                        }
                    }
                }
            }
        }
        Blocked {
            data,
            cout,
            cin,
            k,
            starts,
        }
    }

    fn pairs(&self) -> usize {
        self.cin.div_ceil(2)
    }

    /// One tile of row block `ob`: `init` plus each pair of input channels' taps of group `g` times the tile's
    /// columns of `x` from `col + j·step`, stored to `dst`.
    ///
    /// # Safety
    /// `dst` must be a tile no other thread accesses.
    unsafe fn tile(
        &self,
        (ob, g): (usize, usize),
        x: &Pairs,
        (col, step): (usize, isize),
        init: &[f32; MAX_ROWS],
        dst: &Dst,
    ) {
        let (pairs, taps) = (self.pairs(), self.starts[g + 1] - self.starts[g]);
        assert!(dst.rows <= ROWS && dst.cols <= COLS, "tile shape");
        if taps > 0 {
            let last = col as isize + (taps - 1) as isize * step;
            assert!(
                last >= 0
                    && col.max(last as usize) + dst.cols <= x.row
                    && pairs * x.row <= x.data.len(),
                "conv tile reads outside its input"
            );
        }
        let job = Job {
            pairs,
            taps,
            x: x.data.as_ptr().wrapping_add(col),
            row: x.row,
            step,
            ahead: (taps as isize - 1).max(0) * step.max(0) + 2 * dst.cols as isize - 1,
            init: init.as_ptr(),
            dst,
        };
        let block = self.k * pairs * ROWS;
        let group = &self.data[ob * block + self.starts[g] * pairs * ROWS..(ob + 1) * block];
        // SAFETY: the group's `pairs · taps · 32` weights lie in row block `ob` (the slice above), the columns
        // read lie in `x` (checked above), the CPU has AVX512-BF16 (`Blocked::new` checked) and `dst` is this
        // function's contract.
        unsafe { tile_bf16(group.as_ptr(), &job) }
    }
}

/// Input channels as rows of bf16 pairs `[cin/2][row]`.
struct Pairs<'a> {
    data: &'a [u32],
    row: usize,
}

thread_local! {
    /// The converted input (reused, as `conv::with_scratch`).
    static SCRATCH: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on `columns` of `x[cin][len]` as rows of bf16 pairs (zeros outside `0..len` and for an odd `cin`'s
/// missing channel), converted into this thread's scratch (rows in parallel when `parallel`).
fn with_pairs<R>(
    x: &[f32],
    (cin, len): (usize, usize),
    columns: Range<isize>,
    parallel: bool,
    f: impl FnOnce(&Pairs) -> R,
) -> R {
    let row = columns.len();
    let fill = |buf: &mut Vec<u32>| {
        buf.clear();
        buf.resize(cin.div_ceil(2) * row, 0);
        let n = len as isize;
        let inside = columns.start.clamp(0, n) as usize..columns.end.clamp(0, n) as usize;
        let before = (columns.start.clamp(0, n) - columns.start) as usize;
        chunks_mut(parallel, buf, row, |p, out| {
            let lo = &x[2 * p * len..][..len][inside.clone()];
            let out = &mut out[before..before + inside.len()];
            if 2 * p + 1 < cin {
                let hi = &x[(2 * p + 1) * len..][..len][inside.clone()];
                for ((o, &l), &h) in out.iter_mut().zip(lo).zip(hi) {
                    *o = pair(l, h);
                }
            } else {
                for (o, &l) in out.iter_mut().zip(lo) {
                    *o = pair(l, 0.0);
                }
            }
        });
    };
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut scratch) => {
            fill(&mut scratch);
            f(&Pairs {
                data: &scratch,
                row,
            })
        }
        // A thread waiting in a parallel section that runs another convolution's tile meanwhile.
        Err(_) => {
            let mut own = Vec::new();
            fill(&mut own);
            f(&Pairs { data: &own, row })
        }
    })
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
    let parallel = matches!(par, gemm::Parallelism::Rayon(n) if n > 1);
    with_pairs(x, (w.cin, len), 0..len as isize, parallel, |x| {
        for_tile_blocks(
            (lout, TILES_PER_TIME_TILE * COLS),
            (cout, ROWS),
            par,
            |columns, ob, outs| {
                let (o0, rows) = (outs.start, outs.len());
                let mut init = [0.0; MAX_ROWS];
                init[..rows].copy_from_slice(&bias[outs]);
                for (c, cols) in tiles(columns, COLS) {
                    // SAFETY: the tile is output rows o0..o0+rows × columns c..c+cols of `y[cout][lout]`: time
                    // tiles and row blocks are disjoint, so no other thread writes it.
                    unsafe {
                        let dst = Dst::new(out, o0 * lout + c, (rows, cols), lout, 1);
                        w.tile((ob, 0), x, (c, dilation as isize), &init, &dst);
                    }
                }
            },
        );
    });
}

/// Full transposed convolution (see [`crate::ConvTransposeWeight::forward`]), as `conv_x86::conv_transpose1d`:
/// output phase `r` is a sum over its taps `j` into the columns `m·stride + r` from input column `m − j`, a time
/// tile's window starting `reach` columns early with zeros past the input's ends.
pub fn conv_transpose1d(
    w: &Blocked,
    stride: usize,
    x: &[f32],
    len: usize,
    y: &mut [f32],
    par: gemm::Parallelism,
) {
    let (cout, k, s) = (w.cout, w.k, stride);
    assert_eq!(w.starts.len(), s + 1, "weights blocked for another stride");
    let lfull = (len - 1) * s + k;
    let reach = k.div_ceil(s) - 1;
    let out = SharedOut::new(y);
    let zeros = [0.0; MAX_ROWS];
    for_column_tiles(
        lfull.div_ceil(s),
        TILES_PER_TIME_TILE * COLS,
        par,
        |m0, m1, par| {
            let columns = m0 as isize - reach as isize..m1 as isize;
            with_pairs(x, (w.cin, len), columns, false, |x| {
                for_row_blocks((cout, ROWS), par, |ob, outs| {
                    let (o0, rows) = (outs.start, outs.len());
                    for r in 0..s {
                        let end = m1.min(lfull.saturating_sub(r).div_ceil(s));
                        for (m, cols) in tiles(m0..end.max(m0), COLS) {
                            // SAFETY: the tile is output rows o0..o0+rows × positions m..m+cols of phase r: time
                            // tiles, row blocks and phases are disjoint, so no other thread writes it.
                            unsafe {
                                let dst =
                                    Dst::new(out, o0 * lfull + m * s + r, (rows, cols), lfull, s);
                                w.tile((ob, r), x, (m - m0 + reach, -1), &zeros, &dst);
                            }
                        }
                    }
                });
            });
        },
    );
}

/// One tile's work apart from the weights (see [`Blocked::tile`]).
struct Job<'a> {
    pairs: usize,
    taps: usize,
    /// Pair row 0 at the tile's first column for tap 0.
    x: *const u32,
    row: usize,
    step: isize,
    /// Where in each row of `x` to prefetch (from `x`): the next tile's newest column.
    ahead: isize,
    init: *const f32,
    dst: &'a Dst,
}

/// The tile of 32 channels × `N` columns, `w` the group's first pair of weights.
///
/// # Safety
/// AVX512-BF16 and AVX-512F must be enabled in the caller; `w` and `job` as checked by [`Blocked::tile`], with `N`
/// the job's columns.
#[inline(always)]
unsafe fn tile_n<const N: usize>(w: *const u32, job: &Job) {
    // SAFETY: weights: pair `p`'s taps of the group are `taps · 32` lanes from `w + p · taps · 32` (prefetches
    // may point past them: they do not fault); inputs: tap `j`'s `N` columns of pair row `p` were checked to lie
    // in `x`; `init` holds `MAX_ROWS = 32` values; the features are the caller's (the contract).
    unsafe {
        let mut total = [[0.0f32; MAX_ROWS]; N];
        for column in &mut total {
            column.copy_from_slice(std::slice::from_raw_parts(job.init, MAX_ROWS));
        }
        let taps = job.taps;
        // The exact kernel's blocks of ~`BLOCK_TERMS` products, two products a pair.
        let block = channels_per_block(taps).div_ceil(2);
        let mut first = 0;
        while first < job.pairs {
            let end = (first + block).min(job.pairs);
            let mut acc = [[_mm512_setzero_ps(); 2]; N];
            for p in first..end {
                let w = w.add(p * taps * ROWS);
                let x = job.x.add(p * job.row);
                _mm_prefetch::<_MM_HINT_T0>(x.wrapping_offset(job.ahead).cast());
                for j in 0..taps {
                    let wj = w.add(j * ROWS);
                    let ahead = wj.cast::<i8>().wrapping_add(PREFETCH_BYTES);
                    _mm_prefetch::<_MM_HINT_T0>(ahead);
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
                    let ws: [__m512bh; 2] = [
                        std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(wj.cast())),
                        std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                            wj.add(16).cast(),
                        )),
                    ];
                    let x = x.offset(j as isize * job.step);
                    for (c, row) in acc.iter_mut().enumerate() {
                        let b = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(
                            *x.add(c) as i32,
                        ));
                        for (a, &wv) in row.iter_mut().zip(&ws) {
                            *a = _mm512_dpbf16_ps(*a, wv, b);
                        }
                    }
                }
            }
            for (column, a) in total.iter_mut().zip(&acc) {
                for (v, &a) in a.iter().enumerate() {
                    let p = column.as_mut_ptr().add(v * 16);
                    _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), a));
                }
            }
            first = end;
        }
        let acc: [[__m512; 2]; N] = std::array::from_fn(|c| {
            std::array::from_fn(|v| _mm512_loadu_ps(total[c].as_ptr().add(v * 16)))
        });
        Avx512::store_tile(&acc, job.dst);
    }
}

/// # Safety
/// The CPU must have AVX512-BF16 and AVX-512F; `w` and `job` as for [`tile_n`].
#[target_feature(enable = "avx512f,avx512bf16,avx2,fma,f16c")]
unsafe fn tile_bf16(w: *const u32, job: &Job) {
    // SAFETY: the features are enabled here; the job is this function's contract.
    unsafe {
        match job.dst.cols {
            1 => tile_n::<1>(w, job),
            2 => tile_n::<2>(w, job),
            3 => tile_n::<3>(w, job),
            4 => tile_n::<4>(w, job),
            5 => tile_n::<5>(w, job),
            6 => tile_n::<6>(w, job),
            7 => tile_n::<7>(w, job),
            8 => tile_n::<8>(w, job),
            9 => tile_n::<9>(w, job),
            10 => tile_n::<10>(w, job),
            11 => tile_n::<11>(w, job),
            12 => tile_n::<12>(w, job),
            13 => tile_n::<13>(w, job),
            14 => tile_n::<14>(w, job),
            n => unreachable!("a tile of {n} columns"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::tests::{
        check_with_every_parallelism, conv1d_exact, conv_transpose1d_exact, unwritten, values,
    };
    use crate::conv::{ConvTransposeWeight, ConvWeight, Layout};
    use kazeia_backend_abi::WeightFormat;

    /// The values as the kernel multiplies them: rounded to bf16.
    fn rounded(v: &[f32]) -> Vec<f32> {
        v.iter()
            .map(|&v| f32::from_bits(bf16_bits(v) << 16))
            .collect()
    }

    /// Whether the kernel can be tested here (it is, wherever the fast mode would run it).
    fn here() -> bool {
        if !available() {
            eprintln!("skipped: this CPU has no AVX512-BF16");
        }
        available()
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        for (v, bits) in [
            (1.0f32, 0x3f80),
            (f32::from_bits(0x3f80_8000), 0x3f80), // a tie, to the even 0x3f80
            (f32::from_bits(0x3f81_8000), 0x3f82), // a tie, to the even 0x3f82
            (f32::from_bits(0x3f80_8001), 0x3f81),
            (-2.5, 0xc020),
            (0.0, 0),
        ] {
            assert_eq!(bf16_bits(v), bits, "{v}");
        }
        assert!(f32::from_bits(bf16_bits(f32::NAN) << 16).is_nan());
    }

    /// Dilated convolutions at awkward shapes (odd `cin`, `cout` off the 32-row block, partial column tiles,
    /// dilations, several time tiles), F32 and F16 weights, 1 and 2 threads: each output within the f32 bound of
    /// the exact sum of the bf16-rounded operands.
    #[test]
    fn bf16_conv1d_is_the_sum_of_rounded_operands() {
        if !here() {
            return;
        }
        let time_tile = TILES_PER_TIME_TILE * COLS;
        let shapes = [
            // cout, cin, k, dilation, len
            (1, 1, 1, 1, 1),
            (17, 3, 7, 1, 7),
            (ROWS, ROWS, 1, 1, COLS),
            (ROWS + 1, 5, 3, 2, COLS + 5),
            (ROWS - 1, 19, 7, 9, COLS + 55),
            (2 * ROWS + 1, 33, 5, 3, COLS + 13),
            (2 * ROWS, 2 * ROWS, 7, 1, COLS + 7),
            (ROWS + 3, 9, 4, 2, 3 * COLS + 11),
            (3 * ROWS, 10, 3, 1, 4 * time_tile + 13),
            (40, 301, 7, 3, 2 * COLS + 19),
        ];
        for (cout, cin, k, dilation, len) in shapes {
            let w = values(cout * cin * k, 11, 0.5);
            let bias = values(cout, 12, 0.5);
            let x = values(cin * len, 13, 1.0);
            let lout = len - (k - 1) * dilation;
            for format in [WeightFormat::F32, WeightFormat::F16] {
                let stored = match format {
                    WeightFormat::F16 => crate::conv::tests::rounded(&w),
                    _ => w.clone(),
                };
                let layer = ConvWeight::with_layout(
                    &w,
                    (cout, cin, k),
                    Some(&bias),
                    format,
                    Layout::X86Bf16,
                );
                let exact = conv1d_exact(
                    &rounded(&stored),
                    &bias,
                    &rounded(&x),
                    (cout, cin, k),
                    len,
                    dilation,
                );
                let what = format!("bf16 conv1d {cout}×{cin}×{k} d{dilation} len {len} {format}");
                check_with_every_parallelism(cout * lout, &exact, &what, |y, par| {
                    layer.forward(&x, len, dilation, y, par)
                });
            }
        }
    }

    /// Transposed convolutions at awkward shapes (stride < k, = k, > k, odd `cin`, one input column, outputs off
    /// the tiles, several time tiles): within the f32 bound of the exact sum of the bf16-rounded operands.
    #[test]
    fn bf16_conv_transpose1d_is_the_sum_of_rounded_operands() {
        if !here() {
            return;
        }
        let time_tile = TILES_PER_TIME_TILE * COLS;
        let shapes = [
            // cin, cout, k, stride, len
            (1, 1, 1, 1, 1),
            (5, ROWS + 1, 16, 8, 1),
            (3, ROWS - 1, 4, 2, COLS + 1),
            (11, 2 * ROWS + 1, 3, 5, 7),
            (4, ROWS, 10, 5, 30),
            (13, 2 * ROWS, 7, 3, 29),
            (7, ROWS + 1, 6, 3, 3 * time_tile + 7),
            (4, ROWS + 1, 6, 2, 2 * COLS - 1),
            (3, 5, 9, 2, 2),
            (6, ROWS + 3, 12, 3, 2 * COLS + 7),
        ];
        for (cin, cout, k, stride, len) in shapes {
            let w = values(cin * cout * k, 21, 0.5);
            let x = values(cin * len, 22, 1.0);
            let lfull = (len - 1) * stride + k;
            let layer = ConvTransposeWeight::with_layout(
                &w,
                (cin, cout, k),
                stride,
                WeightFormat::F32,
                Layout::X86Bf16,
            );
            let exact =
                conv_transpose1d_exact(&rounded(&w), &rounded(&x), (cin, cout, k), stride, len);
            let what = format!("bf16 conv_transpose1d {cin}×{cout}×{k} s{stride} len {len}");
            check_with_every_parallelism(cout * lfull, &exact, &what, |y, par| {
                layer.forward(&x, len, y, par)
            });
        }
    }

    /// The rounding is what it costs, no more: on unrounded operands the outputs are near the exact f32 result
    /// (a relative ~2⁻⁹ per operand, summed at random), and far from it next to the exact kernel's error.
    #[test]
    fn bf16_error_is_the_operands_rounding() {
        if !here() {
            return;
        }
        let (cout, cin, k, len) = (64, 256, 7, 200);
        let w = values(cout * cin * k, 31, 0.5);
        let x = values(cin * len, 33, 1.0);
        let layer =
            ConvWeight::with_layout(&w, (cout, cin, k), None, WeightFormat::F32, Layout::X86Bf16);
        let exact = conv1d_exact(&w, &vec![0.0; cout], &x, (cout, cin, k), len, 1);
        let mut y = unwritten(cout * (len - 6));
        layer.forward(&x, len, 1, &mut y, gemm::Parallelism::None);
        let (mut noise, mut signal) = (0.0, 0.0);
        for (&got, &(sum, _, _)) in y.iter().zip(&exact) {
            noise += (f64::from(got) - sum).powi(2);
            signal += sum * sum;
        }
        let snr = 10.0 * (signal / noise).log10();
        // Two operands rounded to 8 bits: ~ −(6.02 · 8 + 1.76 − 3) ≈ 47 dB.
        assert!((40.0..60.0).contains(&snr), "one layer's SNR {snr:.1} dB");
    }

    /// A streamed signal's chunks give the whole signal's outputs bit for bit, as the exact kernels do.
    #[test]
    fn bf16_outputs_are_those_of_the_whole_signal() {
        if !here() {
            return;
        }
        crate::conv::tests::tile_outputs_are_those_of_the_whole_signal(Layout::X86Bf16);
    }
}
