//! The convolutions' tap GEMMs on x86-64 as one register-tile kernel, with AVX-512F or with AVX2 + FMA + F16C,
//! chosen at run time: the twin of `conv_arm.rs`.
//!
//! A tile of 32 output channels (two zmm registers; AVX2: 16 in two ymm) × 14 output columns (AVX2: 6) is held
//! in accumulator registers while every input channel and every tap is added into it, starting from the bias,
//! and is stored once: no pass over the output per tap, no bias pass, no packing per call. Output channels are
//! the vector lanes, so one input channel's weights for one tap are one or two vector loads, and each input
//! value is broadcast into the FMAs. Weights are blocked at upload as `[cout/32][group][cin][taps][32]` (the last
//! block padded with zero rows; a dilated convolution is one group of all its taps, a transposed one a group
//! per output phase), so a tile reads its weights in order; F16 weights are widened in registers (`vcvtph2ps`),
//! so there is no widening pass and no scratch buffer. The input channel is the outer loop and its taps the
//! inner one: the few input columns a channel's taps read stay in L1 across them.
//!
//! A call's last, partial tile of columns runs the kernel compiled for its width (no masking, and a one-frame
//! chunk's few columns cost only their own FMAs). Transposed convolutions are split by output phase, each output
//! written once; the columns whose taps reach outside the input (a phase's first and last few) run one column at
//! a time over the taps that stay inside.
//!
//! The arithmetic is `f32`, as in the official implementation. Every output is a fixed sum whatever the threads or
//! tiling: the input channels in blocks of ~`conv::BLOCK_TERMS` products (each channel's taps in order), each
//! block one fused multiply-add chain from zero, added in order to the bias and the blocks before it (kept in
//! memory: the accumulators fill the registers; ~1 % of the FMAs' time). One chain over all `cin · k` products
//! was ~2× as far from the exact result as the official f32 on the released decoder. The F16 widening is
//! exact, so an F16 layer equals the F32 one on the rounded weights bit for bit.
//!
//! `KAZEIA_X86_CONV=gemm` keeps the `gemm` crate's path (the `Panels` of `conv.rs`) instead, to compare;
//! `KAZEIA_X86_CONV=avx2` takes the AVX2 kernel on an AVX-512 CPU.

use std::arch::x86_64::*;
use std::ops::Range;
use std::sync::OnceLock;

use half::f16;
use kazeia_backend_abi::WeightFormat;

use crate::conv::{channels_per_block, source_index, with_scratch, Stored};
use crate::gemm_call::{for_column_tiles, for_row_blocks, for_tile_blocks, Dst, SharedOut};

/// How far ahead of its loads a tile prefetches its weights (into L1): a one-frame chunk's large layers are one
/// pass over megabytes of weights with few FMAs per load, which the hardware prefetchers alone fed at a quarter of
/// the rate (measured on a Xeon: 1024→1536 k7 over 11 columns, 7.6 → 1.8 ms; 2-8 KiB ahead all within 10 %).
const PREFETCH_BYTES: usize = 8192;

/// The most output channels a tile holds (AVX-512).
const MAX_ROWS: usize = 32;

/// Register tiles per time tile (a unit of parallel work): only a call's last tile of columns is partial.
const TIME_TILE_TILES: usize = 20;

/// The tile kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// 32 output channels × 14 columns in 28 zmm accumulators.
    Avx512,
    /// 16 output channels × 6 columns in 12 ymm accumulators.
    Avx2,
}

impl Isa {
    /// Whether this CPU runs it.
    pub fn available(self) -> bool {
        match self {
            // AVX-512F has the FMAs and the f16 → f32 conversion of zmm registers.
            Isa::Avx512 => is_x86_feature_detected!("avx512f"),
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512 tile",
            Isa::Avx2 => "avx2 tile",
        }
    }

    /// Output channels per tile.
    pub(crate) fn rows(self) -> usize {
        match self {
            Isa::Avx512 => 2 * 16,
            Isa::Avx2 => 2 * 8,
        }
    }

    /// Output columns per tile.
    pub(crate) fn cols(self) -> usize {
        match self {
            Isa::Avx512 => 14,
            Isa::Avx2 => 6,
        }
    }
}

/// The tile kernel in use: the best this CPU has (`KAZEIA_X86_CONV=avx2` caps it at AVX2), or none — the `gemm`
/// path — with `KAZEIA_X86_CONV=gemm` or on a CPU without AVX2.
pub fn selected() -> Option<Isa> {
    static SELECTED: OnceLock<Option<Isa>> = OnceLock::new();
    *SELECTED.get_or_init(|| {
        let choice = std::env::var("KAZEIA_X86_CONV");
        let candidates: &[Isa] = match choice.as_deref() {
            Ok("gemm") => &[],
            Ok("avx2") => &[Isa::Avx2],
            _ => &[Isa::Avx512, Isa::Avx2],
        };
        candidates.iter().copied().find(|isa| isa.available())
    })
}

/// Tap weights blocked for a tile kernel: `[cout/rows][group][cin][taps of the group][rows]`.
pub struct Blocked {
    isa: Isa,
    data: Stored,
    cout: usize,
    cin: usize,
    k: usize,
    /// Group `g` holds `starts[g + 1] − starts[g]` taps, from tap `starts[g]` of the block's order.
    starts: Vec<usize>,
}

impl Blocked {
    /// Blocks `w[cout][cin][k]` (or, with a `stride`, the transposed `w[cin][cout][k]` by output phase: group `r`
    /// is taps `r, r + stride, …`) for `isa`'s tiles, stored as `format` (F32 or F16).
    pub fn new(
        w: &[f32],
        (cout, cin, k): (usize, usize, usize),
        stride: Option<usize>,
        format: WeightFormat,
        isa: Isa,
    ) -> Self {
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
        let mr = isa.rows();
        let dims = (cout, cin, k);
        let blocks = cout.div_ceil(mr);
        let values = (0..blocks).flat_map(|ob| {
            groups.iter().flat_map(move |taps| {
                (0..cin).flat_map(move |i| {
                    taps.iter().flat_map(move |&t| {
                        (ob * mr..(ob + 1) * mr).map(move |o| {
                            if o < cout {
                                w[source_index(o, i, t, dims, stride.is_some())]
                            } else {
                                0.0
                            }
                        })
                    })
                })
            })
        });
        Blocked {
            isa,
            data: Stored::new(blocks * k * cin * mr, values, format),
            cout,
            cin,
            k,
            starts,
        }
    }

    /// Taps in group `g`.
    fn taps(&self, g: usize) -> usize {
        self.starts[g + 1] - self.starts[g]
    }

    /// One tile of row block `ob`: `init` plus, for each input channel `i` and each tap `j` of group `g`, that
    /// tap's weights times the tile's columns of `x.data[i]` from `col + j·step`, stored to `dst` (its `cols`
    /// columns).
    ///
    /// # Safety
    /// `dst` must be a tile no other thread accesses.
    unsafe fn tile(
        &self,
        (ob, g): (usize, usize),
        x: &Window,
        (col, step): (usize, isize),
        init: &[f32; MAX_ROWS],
        dst: &Dst,
    ) {
        let (mr, cin, taps) = (self.isa.rows(), self.cin, self.taps(g));
        assert!(dst.rows <= mr && dst.cols <= self.isa.cols(), "tile shape");
        // Every column read lies in a row of `x`: the first and last taps' windows bound the others'.
        if taps > 0 {
            let last = col as isize + (taps - 1) as isize * step;
            assert!(
                last >= 0
                    && col.max(last as usize) + dst.cols <= x.row
                    && cin * x.row <= x.data.len(),
                "conv tile reads outside its input"
            );
        }
        // The next tile's newest column, from the first column of tap 0.
        let newest = (taps as isize - 1).max(0) * step.max(0) + 2 * dst.cols as isize - 1;
        let job = Job {
            cin,
            taps,
            x: x.data.as_ptr().wrapping_add(col),
            row: x.row,
            step,
            ahead: newest,
            init: init.as_ptr(),
            dst,
        };
        let block = self.k * cin * mr;
        let group = ob * block + self.starts[g] * cin * mr..(ob + 1) * block;
        // SAFETY: the group's `cin · taps · rows` weights lie in row block `ob` (indexing checks that the block
        // exists), the columns read lie in `x` (checked above), the CPU has the kernel's features (`Blocked` is
        // only made for an available kernel), and `dst` is this function's contract.
        unsafe {
            match (&self.data, self.isa) {
                (Stored::F32(w), Isa::Avx512) => tile_avx512(w[group].as_ptr(), &job),
                (Stored::F16(w), Isa::Avx512) => tile_avx512(w[group].as_ptr(), &job),
                (Stored::F32(w), Isa::Avx2) => tile_avx2(w[group].as_ptr(), &job),
                (Stored::F16(w), Isa::Avx2) => tile_avx2(w[group].as_ptr(), &job),
            }
        }
    }
}

/// Some columns of an input `x[cin][len]` as `cin` rows of `row` values: `x` itself (a dilated conv), or a
/// transposed conv's time tile copied with zeros for the columns outside `0..len`, so that the tiles at the
/// input's ends, whose taps reach past them, run all their taps as the others do.
struct Window<'a> {
    data: &'a [f32],
    row: usize,
}

/// Runs `f` on the window of `columns` of `x[cin][len]`, copied into this thread's scratch.
fn with_window<R>(x: &[f32], len: usize, columns: Range<isize>, f: impl FnOnce(&Window) -> R) -> R {
    let n = len as isize;
    let inside = columns.start.clamp(0, n) as usize..columns.end.clamp(0, n) as usize;
    let before = (columns.start.clamp(0, n) - columns.start) as usize;
    let after = columns.len() - before - inside.len();
    let pack = |buf: &mut Vec<f32>| {
        buf.clear();
        for xi in x.chunks_exact(len) {
            buf.extend(std::iter::repeat_n(0.0, before));
            buf.extend_from_slice(&xi[inside.clone()]);
            buf.extend(std::iter::repeat_n(0.0, after));
        }
    };
    let row = columns.len();
    with_scratch(pack, |data| f(&Window { data, row }))
}

/// `c0..c1` as tiles of at most `nr` columns, of widths that differ by one at most (32 columns: 11 + 11 + 10,
/// not 14 + 14 + 4, whose last tile would hold too few accumulators to hide the FMA latency).
fn tiles(columns: Range<usize>, nr: usize) -> impl Iterator<Item = (usize, usize)> {
    let (c0, cols) = (columns.start, columns.len());
    let n = cols.div_ceil(nr);
    let (width, wider) = (cols / n.max(1), cols % n.max(1));
    (0..n).map(move |t| {
        (
            c0 + t * width + t.min(wider),
            width + usize::from(t < wider),
        )
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
    let (cout, k, mr, nr) = (w.cout, w.k, w.isa.rows(), w.isa.cols());
    let lout = len - (k - 1) * dilation;
    let out = SharedOut::new(y);
    let x = Window { data: x, row: len };
    for_tile_blocks(
        (lout, TIME_TILE_TILES * nr),
        (cout, mr),
        par,
        |columns, ob, outs| {
            let (o0, rows) = (outs.start, outs.len());
            let mut init = [0.0; MAX_ROWS];
            init[..rows].copy_from_slice(&bias[outs]);
            for (c, cols) in tiles(columns, nr) {
                // SAFETY: the tile is output rows o0..o0+rows × columns c..c+cols of `y[cout][lout]`: time
                // tiles and row blocks are disjoint, so no other thread writes it.
                unsafe {
                    let dst = Dst::new(out, o0 * lout + c, (rows, cols), lout, 1);
                    w.tile((ob, 0), &x, (c, dilation as isize), &init, &dst);
                }
            }
        },
    );
}

/// Full transposed convolution (see [`crate::ConvTransposeWeight::forward`]); the caller checked the sizes and
/// that `w` was blocked for this stride. Output phase `r` is a sum over its taps `j` (tap `r + j·stride`) into
/// the columns `m·stride + r`, from input column `m − j`; every column of `y` is written once (phases without
/// taps get zeros). A time tile's window starts `reach` columns early, with zeros before column 0 and after the
/// last, so every tile runs all its taps.
pub fn conv_transpose1d(
    w: &Blocked,
    stride: usize,
    x: &[f32],
    len: usize,
    y: &mut [f32],
    par: gemm::Parallelism,
) {
    let (cout, k, s, mr, nr) = (w.cout, w.k, stride, w.isa.rows(), w.isa.cols());
    assert_eq!(w.starts.len(), s + 1, "weights blocked for another stride");
    let lfull = (len - 1) * s + k;
    // The most taps a phase has, less one: how far back a position reads.
    let reach = k.div_ceil(s) - 1;
    let out = SharedOut::new(y);
    let zeros = [0.0; MAX_ROWS];
    for_column_tiles(
        lfull.div_ceil(s),
        TIME_TILE_TILES * nr,
        par,
        |m0, m1, par| {
            let columns = m0 as isize - reach as isize..m1 as isize;
            with_window(x, len, columns, |x| {
                for_row_blocks((cout, mr), par, |ob, outs| {
                    let (o0, rows) = (outs.start, outs.len());
                    for r in 0..s {
                        // Phase r's positions in this time tile.
                        let end = m1.min(lfull.saturating_sub(r).div_ceil(s));
                        for (m, cols) in tiles(m0..end.max(m0), nr) {
                            // SAFETY: the tile is output rows o0..o0+rows × positions m..m+cols of phase r: time
                            // tiles, row blocks and phases are disjoint, so no other thread writes it.
                            unsafe {
                                let dst =
                                    Dst::new(out, o0 * lfull + m * s + r, (rows, cols), lfull, s);
                                // Tap j reads input column m − j, at m − j − (m0 − reach) in the window.
                                w.tile((ob, r), x, (m - m0 + reach, -1), &zeros, &dst);
                            }
                        }
                    }
                });
            });
        },
    );
}

/// One tile's work, for the kernels (see [`Blocked::tile`]), apart from the weights.
struct Job<'a> {
    cin: usize,
    taps: usize,
    /// Input channel 0 at the tile's first column for tap 0.
    x: *const f32,
    row: usize,
    step: isize,
    /// Where in each row of `x` to prefetch (from `x`): the next tile's newest column.
    ahead: isize,
    init: *const f32,
    dst: &'a Dst,
}

/// The vector operations the tile needs, for one ISA.
trait Simd {
    type V: Copy;
    const LANES: usize;
    /// # Safety (all)
    /// The ISA's features must be enabled in the caller; pointers readable (writable) for `LANES` values.
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn load_f16(p: *const f16) -> Self::V;
    unsafe fn broadcast(p: *const f32) -> Self::V;
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn zero() -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);

    /// Stores a tile of `V` vectors of channels × `N` columns to `d`'s rows: the output is channel-major, so
    /// this transposes (by default through a copy).
    ///
    /// # Safety
    /// As for [`tile_n`].
    #[inline(always)]
    unsafe fn store_tile<const V: usize, const N: usize>(acc: &[[Self::V; V]; N], d: &Dst) {
        let mut t = [[0.0f32; MAX_ROWS]; N];
        // SAFETY: `V · LANES ≤ MAX_ROWS` values per column of `t`; `Dst::new` checked that the tile's `rows × N`
        // elements lie in the output, which no other thread accesses (the contract).
        unsafe {
            for (column, a) in t.iter_mut().zip(acc) {
                for (v, &a) in a.iter().enumerate() {
                    Self::store(column.as_mut_ptr().add(v * Self::LANES), a);
                }
            }
            for o in 0..d.rows {
                let p = d.ptr.add(o * d.row_stride);
                for (c, column) in t.iter().enumerate() {
                    *p.add(c * d.col_stride) = column[o];
                }
            }
        }
    }
}

struct Avx512;
struct Avx2;

impl Simd for Avx512 {
    type V = __m512;
    const LANES: usize = 16;
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        // SAFETY: AVX-512F enabled and 16 readable values (the contract).
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const f16) -> __m512 {
        // SAFETY: AVX-512F enabled and 16 readable halves (the contract; `f16` is a transparent `u16`).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn broadcast(p: *const f32) -> __m512 {
        // SAFETY: AVX-512F enabled and one readable value (the contract).
        unsafe { _mm512_set1_ps(*p) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: AVX-512F enabled (the contract); no memory is touched.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F enabled (the contract); no memory is touched.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: AVX-512F enabled (the contract); no memory is touched.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        // SAFETY: AVX-512F enabled and 16 writable values (the contract).
        unsafe { _mm512_storeu_ps(p, v) }
    }

    /// Transposes each 16 channels × 16 columns in registers (64 shuffles), then stores each channel's `N`
    /// columns with one masked store (a masked scatter for a transposed conv's strided columns): the copy
    /// cost a fifth of a 1×1 conv's time at 96 input channels.
    #[inline(always)]
    unsafe fn store_tile<const V: usize, const N: usize>(acc: &[[__m512; V]; N], d: &Dst) {
        assert!(N <= 16 && d.col_stride < (i32::MAX / 16) as usize);
        // SAFETY: AVX-512F enabled (the contract); `Dst::new` checked that the tile's `rows × N` elements lie in
        // the output, which no other thread accesses (the contract), and the masks keep the stores to `N`
        // columns (masked-off lanes do not fault).
        unsafe {
            let mask = ((1u32 << N) - 1) as __mmask16;
            let offsets = _mm512_mullo_epi32(
                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                _mm512_set1_epi32(d.col_stride as i32),
            );
            // The accumulators copied out by constant indices first: a loop that picks them by a variable index
            // makes them an array in memory, and the FMA loop then stores every sum to it.
            let mut halves = [[_mm512_setzero_ps(); 16]; V];
            for (c, a) in acc.iter().enumerate() {
                for (half, &a) in halves.iter_mut().zip(a) {
                    half[c] = a;
                }
            }
            for (v, columns) in halves.iter().enumerate() {
                let rows = d.rows.saturating_sub(v * 16).min(16);
                if rows == 0 {
                    break;
                }
                let t = transpose16(columns);
                for (o, &row) in t.iter().enumerate().take(rows) {
                    let p = d.ptr.add((v * 16 + o) * d.row_stride);
                    if d.col_stride == 1 {
                        _mm512_mask_storeu_ps(p, mask, row);
                    } else {
                        _mm512_mask_i32scatter_ps::<4>(p, mask, offsets, row);
                    }
                }
            }
        }
    }
}

/// `out[o]` lane `c` = `r[c]` lane `o`.
///
/// # Safety
/// AVX-512F must be enabled in the caller.
#[inline(always)]
unsafe fn transpose16(r: &[__m512; 16]) -> [__m512; 16] {
    // SAFETY: AVX-512F enabled (the contract); no memory is touched.
    unsafe {
        // Within each 128-bit lane: 32-bit, then 64-bit interleaves; b[4k + e] lane L then holds element e of
        // lane L of r[4k..4k + 4], i.e. channel 4L + e of those four columns.
        let mut a = [_mm512_setzero_ps(); 16];
        for i in (0..16).step_by(2) {
            a[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
            a[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
        }
        let mut b = [_mm512_setzero_ps(); 16];
        for k in (0..16).step_by(4) {
            for h in 0..2 {
                let (x, y) = (_mm512_castps_pd(a[k + h]), _mm512_castps_pd(a[k + 2 + h]));
                b[k + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(x, y));
                b[k + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x, y));
            }
        }
        // Then, for each e, a 4 × 4 transpose of 128-bit lanes across b[e], b[4 + e], b[8 + e], b[12 + e].
        let mut out = [_mm512_setzero_ps(); 16];
        for e in 0..4 {
            let c0 = _mm512_shuffle_f32x4::<0x44>(b[e], b[4 + e]);
            let c1 = _mm512_shuffle_f32x4::<0xee>(b[e], b[4 + e]);
            let c2 = _mm512_shuffle_f32x4::<0x44>(b[8 + e], b[12 + e]);
            let c3 = _mm512_shuffle_f32x4::<0xee>(b[8 + e], b[12 + e]);
            out[e] = _mm512_shuffle_f32x4::<0x88>(c0, c2);
            out[4 + e] = _mm512_shuffle_f32x4::<0xdd>(c0, c2);
            out[8 + e] = _mm512_shuffle_f32x4::<0x88>(c1, c3);
            out[12 + e] = _mm512_shuffle_f32x4::<0xdd>(c1, c3);
        }
        out
    }
}

impl Simd for Avx2 {
    type V = __m256;
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        // SAFETY: AVX enabled and 8 readable values (the contract).
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const f16) -> __m256 {
        // SAFETY: F16C enabled and 8 readable halves (the contract; `f16` is a transparent `u16`).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn broadcast(p: *const f32) -> __m256 {
        // SAFETY: AVX enabled and one readable value (the contract).
        unsafe { _mm256_broadcast_ss(&*p) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: FMA enabled (the contract); no memory is touched.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX enabled (the contract); no memory is touched.
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: AVX enabled (the contract); no memory is touched.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        // SAFETY: AVX enabled and 8 writable values (the contract).
        unsafe { _mm256_storeu_ps(p, v) }
    }
}

/// A weight element the kernels widen to `f32` in registers.
trait Widen: Sized {
    /// # Safety
    /// As [`Simd::load`].
    unsafe fn load<S: Simd>(p: *const Self) -> S::V;
}

impl Widen for f32 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const f32) -> S::V {
        // SAFETY: this function's contract.
        unsafe { S::load(p) }
    }
}

impl Widen for f16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const f16) -> S::V {
        // SAFETY: this function's contract.
        unsafe { S::load_f16(p) }
    }
}

/// The tile of `V` vectors of channels × `N` columns, `w` the group's first weight.
///
/// # Safety
/// The ISA's features must be enabled in the caller; `w` and `job` as checked by [`Blocked::tile`], with `N`
/// the job's columns and `V · LANES` rows per block.
#[inline(always)]
unsafe fn tile_n<S: Simd, W: Widen, const V: usize, const N: usize>(w: *const W, job: &Job) {
    let mr = V * S::LANES;
    // SAFETY: weights: input channel `i`'s taps of the group are `taps · mr` values from `w + i · taps · mr`
    // (prefetches may point past them: they do not fault); inputs: tap `j`'s `N` columns of row `i` were checked
    // to lie in `x`; `init` holds `MAX_ROWS ≥ mr` values; the features are the caller's (the contract).
    unsafe {
        // The bias, then each block's sum: kept in memory (the accumulators fill the registers), in L1.
        let mut total = [[0.0f32; MAX_ROWS]; N];
        for column in &mut total {
            column[..mr].copy_from_slice(std::slice::from_raw_parts(job.init, mr));
        }
        let taps = job.taps;
        let block = channels_per_block(taps);
        let mut first = 0;
        while first < job.cin {
            let end = (first + block).min(job.cin);
            let mut acc = [[S::zero(); V]; N];
            for i in first..end {
                let w = w.add(i * taps * mr);
                let x = job.x.add(i * job.row);
                // The rows of a long input lie pages apart, too many streams for the hardware prefetchers.
                _mm_prefetch::<_MM_HINT_T0>(x.wrapping_offset(job.ahead).cast());
                for j in 0..taps {
                    let wj = w.add(j * mr);
                    let ahead = wj.cast::<u8>().wrapping_add(PREFETCH_BYTES) as *const i8;
                    for line in 0..(mr * std::mem::size_of::<W>()).div_ceil(64) {
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line));
                    }
                    let ws: [S::V; V] = std::array::from_fn(|v| W::load::<S>(wj.add(v * S::LANES)));
                    let x = x.offset(j as isize * job.step);
                    for (c, row) in acc.iter_mut().enumerate() {
                        let b = S::broadcast(x.add(c));
                        for (a, &wv) in row.iter_mut().zip(&ws) {
                            *a = S::fma(wv, b, *a);
                        }
                    }
                }
            }
            for (column, a) in total.iter_mut().zip(&acc) {
                for (v, &a) in a.iter().enumerate() {
                    let p = column.as_mut_ptr().add(v * S::LANES);
                    S::store(p, S::add(S::load(p), a));
                }
            }
            first = end;
        }
        let acc: [[S::V; V]; N] = std::array::from_fn(|c| {
            std::array::from_fn(|v| S::load(total[c].as_ptr().add(v * S::LANES)))
        });
        S::store_tile(&acc, job.dst);
    }
}

/// Runs `tile_n` for the job's width (1 ..= the ISA's columns).
macro_rules! by_width {
    ($w:expr, $job:expr, $simd:ty, $v:literal, [$($n:literal)*]) => {
        match $job.dst.cols {
            $($n => tile_n::<$simd, W, $v, $n>($w, $job),)*
            n => unreachable!("a tile of {n} columns"),
        }
    };
}

/// # Safety
/// The CPU must have AVX-512F; `w` and `job` as for [`tile_n`].
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn tile_avx512<W: Widen>(w: *const W, job: &Job) {
    // SAFETY: the features are enabled here; the job is this function's contract.
    unsafe { by_width!(w, job, Avx512, 2, [1 2 3 4 5 6 7 8 9 10 11 12 13 14]) }
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C; `w` and `job` as for [`tile_n`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2<W: Widen>(w: *const W, job: &Job) {
    // SAFETY: the features are enabled here; the job is this function's contract.
    unsafe { by_width!(w, job, Avx2, 2, [1 2 3 4 5 6]) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::tests::{
        tile_conv1d_matches_the_exact_sum, tile_conv_transpose1d_matches_the_exact_sum,
        tile_f16_is_f32_on_rounded_weights_bit_for_bit, tile_long_sums_are_blocked, TileShape,
    };
    use crate::conv::Layout;

    /// The kernels this CPU runs (each is tested, whichever is selected), with their tile shapes.
    fn kernels() -> Vec<(Layout, TileShape)> {
        [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .filter(|isa| isa.available())
            .map(|isa| {
                let tile = TileShape {
                    rows: isa.rows(),
                    cols: isa.cols(),
                    time_tile: TIME_TILE_TILES * isa.cols(),
                };
                (Layout::X86(isa), tile)
            })
            .collect()
    }

    #[test]
    fn x86_conv1d_matches_the_exact_sum() {
        for (layout, tile) in kernels() {
            tile_conv1d_matches_the_exact_sum(layout, tile);
        }
    }

    #[test]
    fn x86_conv_transpose1d_matches_the_exact_sum() {
        for (layout, tile) in kernels() {
            tile_conv_transpose1d_matches_the_exact_sum(layout, tile);
        }
    }

    #[test]
    fn x86_long_sums_are_blocked() {
        for (layout, tile) in kernels() {
            tile_long_sums_are_blocked(layout, tile);
        }
    }

    #[test]
    fn x86_outputs_are_those_of_the_whole_signal() {
        for (layout, _) in kernels() {
            crate::conv::tests::tile_outputs_are_those_of_the_whole_signal(layout);
        }
    }

    #[test]
    fn x86_f16_is_f32_on_rounded_weights_bit_for_bit() {
        for (layout, _) in kernels() {
            tile_f16_is_f32_on_rounded_weights_bit_for_bit(layout);
        }
    }

    /// Balanced tiles cover the columns once, in order, none wider than the tile.
    #[test]
    fn tiles_cover_the_columns() {
        for (c0, c1, nr) in [
            (0, 32, 14),
            (5, 5, 14),
            (3, 4, 14),
            (0, 280, 14),
            (7, 30, 6),
        ] {
            let mut next = c0;
            for (c, cols) in tiles(c0..c1, nr) {
                assert_eq!(c, next);
                assert!((1..=nr).contains(&cols));
                next += cols;
            }
            assert_eq!(next, c1);
        }
        let widths: Vec<_> = tiles(0..32, 14).map(|t| t.1).collect();
        assert_eq!(widths, [11, 11, 10]);
    }

    #[test]
    fn the_best_kernel_is_in_use_unless_capped() {
        let expected = match std::env::var("KAZEIA_X86_CONV").as_deref() {
            Ok("gemm") => None,
            Ok("avx2") => Some(Isa::Avx2).filter(|isa| isa.available()),
            _ => [Isa::Avx512, Isa::Avx2]
                .into_iter()
                .find(|isa| isa.available()),
        };
        assert_eq!(selected(), expected);
    }
}
