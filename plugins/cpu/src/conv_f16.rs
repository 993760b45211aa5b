//! f16 arithmetic for the fast decoder mode's 1×1 convolutions, on aarch64 CPUs with FEAT_FP16 (ARMv8.2:
//! Cortex-A55, A76 and later), whose `FMLA .8h` does 8 multiply-adds where the f32 one does 4 (ARM.md).
//!
//! The arithmetic, fixed here and computed the same way by both kernels below: the weights and the input are
//! rounded to f16 (the input once per call, into a buffer zero-padded by a tile's width on the right); each
//! output is its bias in f32 plus, per tap and per block of [`CHAIN`] input channels in order, one chain of f16
//! fused multiply-adds from zero (each `a·b + c` rounded once to f16) widened exactly to f32 and added in f32.
//!
//! - `neon` (aarch64 with FEAT_FP16): a tile of 8 output channels × 24 columns in 24 f16 accumulator
//!   registers, `FMLA .8h` by element (inline `asm!`: Rust's f16 vector intrinsics are unstable), each
//!   chain widened by `FCVTL`/`FCVTL2` into f32 sums kept in memory.
//! - `emulated` (every CPU): the same operations on f32 values holding f16 ones ([`fma16`]: the exact sum
//!   rounded to odd in f32, then to nearest-even f16, is the exact sum rounded once), bit for bit what the NEON
//!   kernel gives (`tests`, under QEMU's Cortex-A76); two orders of magnitude slower than the f32 kernels (a
//!   released-shape decode of 36 frames: ~15 s on two Zen 4 threads). It lets an x86 machine measure the ARM
//!   fast decoder's accuracy (`engine-core/tests/it/codec_fast.rs`).
//!
//! `KAZEIA_ARM_CONV=f32` keeps them in f32 on an FP16 CPU, to compare (`=gemm` too).
//!
//! Why only the 1×1 convolutions: against the exact decoder, on the released decoder's shape (F16 weights,
//! `released_random`; ARM.md has the rest), f16 arithmetic in chains of 16 on the 1×1 ones alone gives
//! 52.2 dB SNR (bound 40); on every direct convolution 40.4 dB, the transposed ones alone 42.7 dB. f16 operands
//! with f32 sums would give 50.1 dB on all of them: the f16 chains cost the rest, growing with their length
//! (1×1 ones: 49.6 dB in chains of 32, 46.8 of 64), so [`CHAIN`] weighs that against the widening's cost.

use std::cell::RefCell;

use half::f16;

use crate::gemm_call::{for_tile_blocks, Dst, SharedOut};

/// Output channels per tile.
const MR: usize = 8;
/// Output columns per tile: three vectors of 8 halves.
const NR: usize = 24;
/// Columns per time tile (a unit of parallel work): a multiple of `NR`.
const TIME_TILE: usize = 10 * NR;
/// Input channels per f16 chain (per tap). Longer chains round more (above); shorter ones widen more often: a
/// chain of 16 is 16 × 24 `FMLA .8h`, then 131 vector operations to start the next and widen and add this one
/// (48 `FCVTL`, 48 `FADD`, 24 `MOVI`, 11 `MOV` in the release build), so 1.50× the multiply-adds per cycle of
/// the f32 tile on the A76's two pipes rather than 2× (chains of 32: 1.72×, of 8: 1.20×; ARM.md).
pub(crate) const CHAIN: usize = 16;

/// Whether the fast mode computes a convolution of these dimensions in f16: the 1×1 ones.
pub(crate) fn suits(_cout: usize, _cin: usize, k: usize) -> bool {
    k == 1
}

/// The f16 kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// `FMLA .8h` (aarch64 with FEAT_FP16).
    #[cfg(target_arch = "aarch64")]
    Neon,
    /// The same arithmetic in portable code (f32 operations, SSE2 on x86-64).
    Emulated,
}

/// Whether `KAZEIA_ARM_CONV` keeps the fast mode's 1×1 convolutions in f32: `f32` (on the NEON f32 tile, to
/// compare) or `gemm` (every convolution on the `gemm` crate's path).
#[cfg(target_arch = "aarch64")]
fn capped() -> bool {
    static CAPPED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CAPPED.get_or_init(|| {
        matches!(
            std::env::var("KAZEIA_ARM_CONV").as_deref(),
            Ok("f32" | "gemm")
        )
    })
}

impl Kernel {
    /// The kernel with f16 arithmetic in hardware, where this CPU has it: aarch64 with FEAT_FP16, unless
    /// `KAZEIA_ARM_CONV` is `f32` or `gemm`.
    pub fn native() -> Option<Self> {
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("fp16") && !capped() {
            return Some(Kernel::Neon);
        }
        None
    }

    /// The native kernel, else the emulation.
    pub fn native_or_emulated() -> Self {
        Self::native().unwrap_or(Kernel::Emulated)
    }
}

/// Weights rounded to f16 and blocked `[cout/8][k][cin][8]` (the last block padded with zero rows).
pub struct Blocked {
    w: Vec<f16>,
    cout: usize,
    cin: usize,
    k: usize,
    kernel: Kernel,
}

impl Blocked {
    /// Blocks `w[cout][cin][k]`, rounded to f16, for `kernel`.
    pub fn new(w: &[f32], (cout, cin, k): (usize, usize, usize), kernel: Kernel) -> Self {
        assert_eq!(w.len(), cout * cin * k, "conv1d weight size");
        let n = cout.div_ceil(MR) * k * cin * MR;
        let mut blocked = Vec::with_capacity(n);
        blocked.extend((0..n).map(|j| {
            let (r, i, t, ob) = (j % MR, j / MR % cin, j / (MR * cin) % k, j / (MR * cin * k));
            let o = ob * MR + r;
            f16::from_f32(if o < cout {
                w[(o * cin + i) * k + t]
            } else {
                0.0
            })
        }));
        Blocked {
            w: blocked,
            cout,
            cin,
            k,
            kernel,
        }
    }

    #[cfg(test)]
    pub(crate) fn kernel(&self) -> Kernel {
        self.kernel
    }
}

thread_local! {
    /// The input as f16 (NEON) or as f32 values holding f16 ones (emulation), padded: reused across calls.
    static HALVES: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
    static ROUNDED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on `x[cin][len]` rounded to f16 into `[cin][len + NR]` (zeros after each row), in this thread's
/// buffer `buf` (or a fresh one if a convolution running on this thread already holds it).
fn with_padded<T: Copy + Default, R>(
    buf: &'static std::thread::LocalKey<RefCell<Vec<T>>>,
    (x, cin, len): (&[f32], usize, usize),
    round: impl Fn(&[f32], &mut [T]),
    f: impl FnOnce(&[T]) -> R,
) -> R {
    let fill = |p: &mut Vec<T>| {
        let wid = len + NR;
        p.clear();
        p.resize(cin * wid, T::default());
        for (row, src) in p.chunks_exact_mut(wid).zip(x.chunks_exact(len)) {
            round(src, &mut row[..len]);
        }
    };
    crate::conv::with_scratch_in(buf, fill, f)
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
    let input = (x, w.cin, len);
    match w.kernel {
        #[cfg(target_arch = "aarch64")]
        Kernel::Neon => with_padded(&HALVES, input, neon::round, |xp| {
            run(w, bias, len, dilation, y, par, |ob, taps, init, out| {
                // SAFETY: this kernel is chosen only where the CPU has FEAT_FP16 (`Kernel::native`); `tiles`
                // names a row block of `w` and columns inside `xp`'s padded rows.
                unsafe { neon::tile(w, ob, xp, len + NR, taps, init, out) }
            })
        }),
        Kernel::Emulated => with_padded(&ROUNDED, input, emulated::round, |xp| {
            run(w, bias, len, dilation, y, par, |ob, taps, init, out| {
                emulated::tile(w, ob, xp, len + NR, taps, init, out)
            })
        }),
    }
}

/// `(tap, first input column)` of each tap of a tile.
type Taps<'a> = &'a [(usize, usize)];

/// The tiles of a convolution, each computed by `tile(ob, taps, bias, out)` into `out` and stored to `y`.
fn run(
    w: &Blocked,
    bias: &[f32],
    len: usize,
    dilation: usize,
    y: &mut [f32],
    par: gemm::Parallelism,
    tile: impl Fn(usize, Taps, &[f32; MR], &mut [[f32; NR]; MR]) + Sync + Send,
) {
    let (cout, k) = (w.cout, w.k);
    let lout = len - (k - 1) * dilation;
    let out = SharedOut::new(y);
    for_tile_blocks((lout, TIME_TILE), (cout, MR), par, |cols, ob, outs| {
        let (o0, rows) = (outs.start, outs.len());
        let mut init = [0.0; MR];
        init[..rows].copy_from_slice(&bias[outs]);
        let mut taps = [(0, 0); 32];
        assert!(k <= taps.len(), "an f16 convolution of {k} taps");
        for c in cols.clone().step_by(NR) {
            for (t, tap) in taps[..k].iter_mut().enumerate() {
                *tap = (t, c + t * dilation);
            }
            let mut t = [[0.0; NR]; MR];
            tile(ob, &taps[..k], &init, &mut t);
            // SAFETY: the tile is output rows o0..o0+rows × columns c..c+cols of `y[cout][lout]`: time tiles
            // and row blocks are disjoint, so no other thread writes it.
            unsafe {
                let d = Dst::new(out, o0 * lout + c, (rows, (cols.end - c).min(NR)), lout, 1);
                for (r, row) in t.iter().enumerate().take(d.rows) {
                    std::ptr::copy_nonoverlapping(
                        row.as_ptr(),
                        d.ptr.add(r * d.row_stride),
                        d.cols,
                    );
                }
            }
        }
    });
}

/// `a · b + c` rounded once to f16, for f16 values held as f32: the product is exact in f32 (22 significant
/// bits, exponents from −48), the sum is rounded to odd in f32 (an inexact sum whose last bit is even moves one
/// ulp toward the exact one, known from TwoSum), and with 13 bits to spare that rounding, then to nearest-even f16,
/// is the exact sum's (Boldo and Melquiond's rounding to odd). An f64 sum converted by the `half` crate's
/// `from_f64` would round twice on x86-64, where it goes through f32: ~1 in 15 000 of the test's cases (an f16
/// midpoint plus a small term); a correctly rounded f64 → f16 conversion still would where the small term falls
/// below the f64 sum's last bit.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))] // x86-64 runs its SSE2 twin (tested against it)
#[inline(always)]
pub(crate) fn fma16(a: f32, b: f32, c: f32) -> f32 {
    let p = a * b;
    let s = p + c;
    let bp = s - c;
    let ap = s - bp;
    let e = (p - bp) + (c - ap);
    let bits = s.to_bits();
    let nudge = u32::from(e != 0.0) & u32::from(s.is_finite()) & !bits & 1;
    // +1 (away from zero) when the error has the sum's sign, else −1.
    let away = u32::from((e.to_bits() ^ bits) >> 31 == 0);
    let delta = (away << 1).wrapping_sub(1) & 0u32.wrapping_sub(nudge);
    round_f16(f32::from_bits(bits.wrapping_add(delta)))
}

/// `v` rounded to the nearest f16 (ties to even; ±∞ past 65504), as f32.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
#[inline(always)]
pub(crate) fn round_f16(v: f32) -> f32 {
    let a = v.abs();
    // Below f16's normals: multiples of 2⁻²⁴, the ulp of f32 in [½, 1).
    let sub = (a + 0.5) - 0.5;
    let b = a.to_bits();
    let normal = f32::from_bits((b + 0x0fff + ((b >> 13) & 1)) & !0x1fff);
    let normal = if normal > 65504.0 {
        f32::INFINITY
    } else {
        normal
    };
    let m = if a < 6.103_515_6e-5 { sub } else { normal };
    f32::from_bits(m.to_bits() | (v.to_bits() & 0x8000_0000))
}

/// The portable kernel: f16 arithmetic on f32 values holding f16 ones.
mod emulated {
    use super::*;

    /// `x` rounded to f16, as f32.
    pub(super) fn round(x: &[f32], out: &mut [f32]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = f16::from_f32(v).to_f32();
        }
    }

    /// `acc[j] = a · b[j] + acc[j]`, each rounded once to f16 ([`fma16`]).
    #[inline(always)]
    fn fma16_lanes(a: f32, b: &[f32; NR], acc: &mut [f32; NR]) {
        #[cfg(target_arch = "x86_64")]
        for (b, acc) in b.chunks_exact(4).zip(acc.chunks_exact_mut(4)) {
            let (b, acc): (&[f32; 4], &mut [f32; 4]) =
                (b.try_into().expect("4"), acc.try_into().expect("4"));
            *acc = sse2::fma16x4(a, b, acc);
        }
        #[cfg(not(target_arch = "x86_64"))]
        for (&b, acc) in b.iter().zip(acc) {
            *acc = fma16(a, b, *acc);
        }
    }

    /// One tile of row block `ob`: `init` plus, per tap `(tap, col)`, the products of the tap's weights and
    /// columns `col..col + NR` of `xp` (rows `wid` apart), in chains of [`CHAIN`] input channels.
    pub(super) fn tile(
        w: &Blocked,
        ob: usize,
        xp: &[f32],
        wid: usize,
        taps: Taps,
        init: &[f32; MR],
        out: &mut [[f32; NR]; MR],
    ) {
        let (cin, k) = (w.cin, w.k);
        let block = &w.w[ob * k * cin * MR..][..k * cin * MR];
        for (r, total) in out.iter_mut().enumerate() {
            *total = [init[r]; NR];
            for &(tap, col) in taps {
                for first in (0..cin).step_by(CHAIN) {
                    let mut acc = [0.0f32; NR];
                    for i in first..(first + CHAIN).min(cin) {
                        let wv = block[(tap * cin + i) * MR + r].to_f32();
                        let xs: &[f32; NR] = xp[i * wid + col..][..NR].try_into().expect("NR");
                        fma16_lanes(wv, xs, &mut acc);
                    }
                    for (t, a) in total.iter_mut().zip(acc) {
                        *t += a;
                    }
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    pub(super) mod sse2 {
        use std::arch::x86_64::*;

        /// [`super::fma16`] on 4 lanes: the same operations, bit for bit.
        #[inline(always)]
        pub(crate) fn fma16x4(a: f32, b: &[f32; 4], c: &[f32; 4]) -> [f32; 4] {
            // SAFETY: SSE2 is part of the x86-64 baseline; the loads and stores are of 4-element arrays.
            unsafe {
                let (b, c) = (_mm_loadu_ps(b.as_ptr()), _mm_loadu_ps(c.as_ptr()));
                let p = _mm_mul_ps(_mm_set1_ps(a), b);
                let s = _mm_add_ps(p, c);
                let bp = _mm_sub_ps(s, c);
                let ap = _mm_sub_ps(s, bp);
                let e = _mm_add_ps(_mm_sub_ps(p, bp), _mm_sub_ps(c, ap));
                let bits = _mm_castps_si128(s);
                let one = _mm_set1_epi32(1);
                let abs = _mm_castsi128_ps(_mm_set1_epi32(0x7fff_ffff));
                let inexact = _mm_castps_si128(_mm_cmpneq_ps(e, _mm_setzero_ps()));
                let finite =
                    _mm_castps_si128(_mm_cmple_ps(_mm_and_ps(s, abs), _mm_set1_ps(f32::MAX)));
                let even = _mm_cmpeq_epi32(_mm_and_si128(bits, one), _mm_setzero_si128());
                // 0 where the error has the sum's sign (+1), all ones elsewhere (−1).
                let toward = _mm_srai_epi32(_mm_xor_si128(_mm_castps_si128(e), bits), 31);
                let nudge = _mm_and_si128(inexact, _mm_and_si128(finite, even));
                let odd = _mm_add_epi32(bits, _mm_and_si128(_mm_or_si128(one, toward), nudge));
                // round_f16
                let v = _mm_castsi128_ps(odd);
                let sign = _mm_andnot_ps(abs, v);
                let a = _mm_and_ps(v, abs);
                let half = _mm_set1_ps(0.5);
                let sub = _mm_sub_ps(_mm_add_ps(a, half), half);
                let ab = _mm_castps_si128(a);
                let lsb = _mm_and_si128(_mm_srli_epi32(ab, 13), one);
                let rounded = _mm_add_epi32(_mm_add_epi32(ab, _mm_set1_epi32(0x0fff)), lsb);
                let normal = _mm_castsi128_ps(_mm_and_si128(rounded, _mm_set1_epi32(!0x1fff)));
                let over = _mm_cmpgt_ps(normal, _mm_set1_ps(65504.0));
                let normal = _mm_or_ps(
                    _mm_andnot_ps(over, normal),
                    _mm_and_ps(over, _mm_set1_ps(f32::INFINITY)),
                );
                let small = _mm_cmplt_ps(a, _mm_set1_ps(6.103_515_6e-5));
                let m = _mm_or_ps(_mm_and_ps(small, sub), _mm_andnot_ps(small, normal));
                let mut out = [0.0; 4];
                _mm_storeu_ps(out.as_mut_ptr(), _mm_or_ps(m, sign));
                out
            }
        }
    }
}

/// The NEON kernel (aarch64 with FEAT_FP16).
#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;
    use std::arch::asm;

    use super::*;

    /// `x` rounded to f16 (`FCVTN`, ARMv8.0), as bits.
    pub(super) fn round(x: &[f32], out: &mut [u16]) {
        let mut src = x.chunks_exact(4);
        let mut dst = out.chunks_exact_mut(4);
        for (s, d) in (&mut src).zip(&mut dst) {
            // SAFETY: 4 values each side; NEON and FCVTN are part of the aarch64 baseline; `float16x4_t` and
            // `uint16x4_t` are both 4 × 16 bits.
            unsafe {
                let h = vcvt_f16_f32(vld1q_f32(s.as_ptr()));
                vst1_u16(
                    d.as_mut_ptr(),
                    std::mem::transmute::<float16x4_t, uint16x4_t>(h),
                );
            }
        }
        for (d, &s) in dst.into_remainder().iter_mut().zip(src.remainder()) {
            *d = f16::from_f32(s).to_bits();
        }
    }

    /// `acc[r][v] += xs[v] · w[r]` in f16: 24 `FMLA .8h` by element. To be used in an `unsafe` block of a
    /// function with the `fp16` target feature (the instruction needs FEAT_FP16; it touches registers only, and
    /// the element operand must be one of v0–v15 for `.h` lanes: `vreg_low16`).
    macro_rules! fma_tile {
        ($acc:ident, $w:ident, $xs:ident, $($r:literal)*) => {$(
            for v in 0..3 {
                asm!(
                    concat!("fmla {a:v}.8h, {x:v}.8h, {w:v}.h[", $r, "]"),
                    a = inout(vreg) $acc[$r][v],
                    x = in(vreg) $xs[v],
                    w = in(vreg_low16) $w,
                    options(pure, nomem, nostack, preserves_flags),
                );
            }
        )*};
    }

    /// One tile of row block `ob` (see `emulated::tile`, whose arithmetic this is).
    ///
    /// # Safety
    /// The CPU must have FEAT_FP16; each `(tap, col)` must have `tap < k` and `col + NR` columns in each of `xp`'s
    /// `cin` rows of `wid`.
    #[target_feature(enable = "fp16")]
    #[inline(never)]
    pub(super) unsafe fn tile(
        w: &Blocked,
        ob: usize,
        xp: &[u16],
        wid: usize,
        taps: Taps,
        init: &[f32; MR],
        out: &mut [[f32; NR]; MR],
    ) {
        let (cin, k) = (w.cin, w.k);
        let block = &w.w[ob * k * cin * MR..][..k * cin * MR];
        assert!(xp.len() >= cin * wid, "f16 input rows");
        for (row, &b) in out.iter_mut().zip(init) {
            row.fill(b);
        }
        for &(tap, col) in taps {
            assert!(
                tap < k && col + NR <= wid,
                "tap {tap} of {k} at column {col} of {wid}"
            );
            let wt = block[tap * cin * MR..].as_ptr().cast::<u16>();
            let xt = xp[col..].as_ptr();
            for first in (0..cin).step_by(CHAIN) {
                let end = (first + CHAIN).min(cin);
                // SAFETY: NEON is part of the aarch64 baseline, FEAT_FP16 this function's contract (and target
                // feature: `fma_tile`'s `FMLA .8h`, on registers only); the weight loads stay in the tap's
                // `cin · 8` (`f16` is a transparent `u16`), the input loads in rows `first..end` at columns
                // `col..col + NR` (checked above).
                unsafe {
                    let mut acc = [[vdupq_n_u16(0); 3]; MR];
                    for i in first..end {
                        let wv = vld1q_u16(wt.add(i * MR));
                        let p = xt.add(i * wid);
                        let xs = [vld1q_u16(p), vld1q_u16(p.add(8)), vld1q_u16(p.add(16))];
                        fma_tile!(acc, wv, xs, 0 1 2 3 4 5 6 7);
                    }
                    for (row, a) in out.iter_mut().zip(&acc) {
                        for (v, &a) in a.iter().enumerate() {
                            let p = row.as_mut_ptr().add(8 * v);
                            let lo = vcvt_f32_f16(std::mem::transmute::<uint16x4_t, float16x4_t>(
                                vget_low_u16(a),
                            ));
                            let hi = vcvt_high_f32_f16(std::mem::transmute::<
                                uint16x8_t,
                                float16x8_t,
                            >(a));
                            vst1q_f32(p, vaddq_f32(vld1q_f32(p), lo));
                            vst1q_f32(p.add(4), vaddq_f32(vld1q_f32(p.add(4)), hi));
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::tests::values;

    /// `a · b + c` for f16 values, rounded once to f16, in integers: every f16 is a multiple of 2⁻²⁴, so the
    /// exact sum is `n · 2⁻⁴⁸` with `|n| < 2⁸¹`.
    fn fma16_reference(a: f16, b: f16, c: f16) -> f32 {
        let units = |h: f16| (f64::from(h.to_f32()) * f64::from(1u32 << 24)) as i128;
        let n = units(a) * units(b) + (units(c) << 24);
        if n == 0 {
            // An exact zero is +0 (rounding to nearest) unless both terms are −0.
            let negative = (a.is_sign_negative() != b.is_sign_negative()) && c.is_sign_negative();
            return if negative { -0.0 } else { 0.0 };
        }
        let m = n.unsigned_abs();
        // The quantum at |n|'s binade in units of 2⁻⁴⁸: 2^(e − 10) for 2^e ≤ |sum| (e ≥ −14), else 2⁻²⁴.
        let e = 127 - m.leading_zeros() as i32 - 48;
        let q: u128 = 1 << ((e.max(-14) - 10) + 48);
        let (quot, rem) = (m / q, m % q);
        let up = rem > q / 2 || (rem == q / 2 && quot % 2 == 1);
        let v = ((quot + u128::from(up)) * q) as f64 / 2f64.powi(48);
        let v = if v > 65504.0 { f64::INFINITY } else { v };
        (if n < 0 { -v } else { v }) as f32
    }

    fn xorshift(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    /// Random f16 operands (a quarter of the time with an addend far below the product, where a sum rounded
    /// through f32 rounds twice) against the integer reference; the SSE2 lanes give the same bits.
    #[test]
    fn fma16_is_the_exact_sum_rounded_once() {
        let mut next = xorshift(7);
        let finite = |b: u64| Some(f16::from_bits(b as u16)).filter(|h| h.is_finite());
        for n in 0..4_000_000u64 {
            let r = next();
            let (Some(a), Some(b), Some(mut c)) = (finite(r), finite(r >> 16), finite(r >> 32))
            else {
                continue;
            };
            if n % 4 == 0 {
                c = f16::from_bits((c.to_bits() & 0x83ff) | 0x0400);
            }
            let want = fma16_reference(a, b, c);
            let got = fma16(a.to_f32(), b.to_f32(), c.to_f32());
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{a}·{b}+{c}: {got:e}, not {want:e}"
            );
            #[cfg(target_arch = "x86_64")]
            {
                let lanes = emulated::sse2::fma16x4(a.to_f32(), &[b.to_f32(); 4], &[c.to_f32(); 4]);
                assert_eq!(lanes[0].to_bits(), got.to_bits(), "SSE2 {a}·{b}+{c}");
            }
        }
    }

    /// `round_f16` is `half`'s f32 → f16 conversion, on random bits and around every f16's midpoints.
    #[test]
    fn round_f16_is_the_conversion() {
        let mut next = xorshift(1);
        for n in 0..4_000_000u64 {
            let s = next();
            let v = if n % 2 == 0 {
                f32::from_bits(s as u32)
            } else {
                let h = f16::from_bits((s >> 32) as u16).to_f32();
                f32::from_bits(
                    h.to_bits()
                        .wrapping_add((s as u32 % 8192).wrapping_sub(4096)),
                )
            };
            if !v.is_nan() {
                let want = f16::from_f32(v).to_f32();
                assert_eq!(round_f16(v).to_bits(), want.to_bits(), "{v:e}");
            }
        }
    }

    /// Each output from the definition: bias, then per tap and chain of `CHAIN` channels an f16 chain, added
    /// in f32 — one scalar `fma16` at a time.
    fn conv1d_reference(
        w: &[f32],
        bias: &[f32],
        x: &[f32],
        (cout, cin, k): (usize, usize, usize),
        len: usize,
        dilation: usize,
    ) -> Vec<f32> {
        let h = |v: f32| f16::from_f32(v).to_f32();
        let lout = len - (k - 1) * dilation;
        let mut y = vec![0.0; cout * lout];
        for o in 0..cout {
            for c in 0..lout {
                let mut total = bias[o];
                for t in 0..k {
                    for first in (0..cin).step_by(CHAIN) {
                        let mut acc = 0.0;
                        for i in first..(first + CHAIN).min(cin) {
                            let (wv, xv) =
                                (w[(o * cin + i) * k + t], x[i * len + c + t * dilation]);
                            acc = fma16(h(wv), h(xv), acc);
                        }
                        total += acc;
                    }
                }
                y[o * lout + c] = total;
            }
        }
        y
    }

    /// The shapes the kernels are checked on: `cout`/`cin` off the row block and the chain, outputs shorter than
    /// a tile and off it, k > 1 with dilation, several time tiles.
    const SHAPES: [(usize, usize, usize, usize, usize); 8] = [
        // cout, cin, k, dilation, len
        (1, 1, 1, 1, 1),
        (MR, CHAIN, 1, 1, NR),
        (MR + 1, 2 * CHAIN + 3, 1, 1, NR + 5),
        (MR - 1, 19, 1, 1, 2 * TIME_TILE + 7),
        (2 * MR + 3, 40, 3, 2, NR + 13),
        (3, 7, 7, 9, 3 * NR + 1),
        (96, 96, 1, 1, TIME_TILE + 11),
        (17, 33, 1, 1, 5),
    ];

    fn check_kernel(kernel: Kernel) {
        for (cout, cin, k, dilation, len) in SHAPES {
            let w = values(cout * cin * k, 51, 0.5);
            let bias = values(cout, 52, 0.5);
            let x = values(cin * len, 53, 2.0);
            let want = conv1d_reference(&w, &bias, &x, (cout, cin, k), len, dilation);
            let layer = Blocked::new(&w, (cout, cin, k), kernel);
            let lout = len - (k - 1) * dilation;
            for par in [gemm::Parallelism::None, gemm::Parallelism::Rayon(2)] {
                let mut y = vec![f32::NAN; cout * lout];
                conv1d(&layer, &bias, &x, len, dilation, &mut y, par);
                for (n, (a, b)) in y.iter().zip(&want).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{kernel:?} {cout}×{cin}×{k} d{dilation} len {len} {par:?}: output {n} is {a}, \
                         not {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn emulated_kernel_is_the_definition_bit_for_bit() {
        check_kernel(Kernel::Emulated);
    }

    /// Under QEMU's Cortex-A76 (and `max`) the NEON kernel runs, and gives the emulation's bits; under its
    /// Cortex-A53 (no FEAT_FP16) there is none (`KAZEIA_EXPECT_ARM_FP16` says which the model should offer).
    #[test]
    fn the_native_kernel_is_the_definition_bit_for_bit() {
        if let Ok(expected) = std::env::var("KAZEIA_EXPECT_ARM_FP16") {
            #[cfg(target_arch = "aarch64")]
            let expected = expected == "1" && !capped();
            #[cfg(not(target_arch = "aarch64"))]
            let expected = expected == "1";
            assert_eq!(
                Kernel::native().is_some(),
                expected,
                "FEAT_FP16 on this CPU model"
            );
        }
        match Kernel::native() {
            Some(kernel) => check_kernel(kernel),
            None => eprintln!("no f16 arithmetic on this CPU: nothing to check"),
        }
    }

    /// Activations past f16's range (65504) overflow to ±∞ in the chain, as in hardware (the decoder's
    /// largest into a 1×1 convolution is ~15).
    #[test]
    fn overflow_gives_infinity() {
        let kernel = Kernel::native_or_emulated();
        let layer = Blocked::new(&[2.0], (1, 1, 1), kernel);
        let mut y = [0.0f32; 2];
        conv1d(
            &layer,
            &[0.0],
            &[40000.0, 1.0],
            2,
            1,
            &mut y,
            gemm::Parallelism::None,
        );
        assert_eq!(y, [f32::INFINITY, 2.0]);
    }
}
