//! aarch64 kernels for the decode-and-dot path of linear layers (few rows: token steps).
//!
//! - Q8_0 / Q4_0 weights × int8 activations ([`crate::int8`]): one exact `i32` product per 32-value block,
//!   by `SDOT` (ARMv8.2 dotprod), by `SMMLA` (ARMv8.6 i8mm: 2 activation rows × 2 output rows per
//!   instruction, for 2–8 rows), or on ARMv8.0 by `SMULL`/`SMLAL` + `SADALP`. All three give exactly
//!   [`crate::int8::dot_reference`]'s result. The block scales are read as `f32`, or as halves where all of a
//!   weight's are halves ([`BlockScales`]: 2 bytes a block less to stream).
//! - F32 / F16 / BF16 (and, for comparisons, Q8_0 / Q4_0 decoded to f32): weights widened to f32 in registers
//!   (BF16 by a shift, F16 by `FCVTL`), `FMLA` into f32 accumulators, activations kept in f32 (f16 arithmetic
//!   or BFDOT would round the activations to 11 or 8 bits, which the official implementation does not).
//!
//! `SDOT`/`SMMLA` are written as inline `asm!` inside `#[target_feature]` functions: their
//! `core::arch::aarch64` intrinsics are not stable yet. The kernel is chosen once at run time with
//! `is_aarch64_feature_detected!`; `KAZEIA_ARM_KERNEL=neon|dotprod|i8mm` caps the choice (to compare).

use std::arch::aarch64::*;
use std::arch::asm;
use std::sync::OnceLock;

use crate::int8::{weight_scales, QuantizedActs};
use crate::linear::{f16_to_f32, LinearWeight, Scales, Storage, BLOCK};

/// The integer kernels, slowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kernel {
    /// ARMv8.0 Advanced SIMD: widening multiplies.
    Neon,
    /// ARMv8.2 dotprod: `SDOT`.
    Dotprod,
    /// ARMv8.6 i8mm: `SMMLA` for two rows and more, `SDOT` for one.
    I8mm,
}

impl Kernel {
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Neon => "neon",
            Kernel::Dotprod => "dotprod",
            Kernel::I8mm => "i8mm",
        }
    }
}

/// The kernels this CPU can run, slowest first.
pub fn available() -> &'static [Kernel] {
    static AVAILABLE: OnceLock<Vec<Kernel>> = OnceLock::new();
    AVAILABLE.get_or_init(|| {
        let mut k = vec![Kernel::Neon];
        if std::arch::is_aarch64_feature_detected!("dotprod") {
            k.push(Kernel::Dotprod);
            if std::arch::is_aarch64_feature_detected!("i8mm") {
                k.push(Kernel::I8mm);
            }
        }
        k
    })
}

/// The kernel in use: the best available, capped by `KAZEIA_ARM_KERNEL`.
pub fn selected() -> Kernel {
    static SELECTED: OnceLock<Kernel> = OnceLock::new();
    *SELECTED.get_or_init(|| {
        let best = *available().last().unwrap();
        let cap = match std::env::var("KAZEIA_ARM_KERNEL").as_deref() {
            Ok("neon") => Kernel::Neon,
            Ok("dotprod") => Kernel::Dotprod,
            _ => Kernel::I8mm,
        };
        best.min(cap)
    })
}

/// Int8 activations for `w` when its format has integer kernels (Q8_0, Q4_0).
pub(crate) fn quantize_for(w: &LinearWeight, x: &[f32], rows: usize) -> Option<QuantizedActs> {
    matches!(w.storage, Storage::Q8_0 { .. } | Storage::Q4_0 { .. }).then(|| {
        let pairs = selected() == Kernel::I8mm && rows >= 2;
        QuantizedActs::new(x, rows, w.padded_in, pairs)
    })
}

/// A weight's block scales as the integer kernels read them: `f32`, or halves widened by `FCVTL`.
trait BlockScales {
    /// Scales `at..at + n` (n ≤ 4) in lanes 0..n, zero beyond.
    ///
    /// # Safety
    /// When `n == 4`, scales `at..at + 4` must exist (fewer are copied through a bounds-checked slice).
    unsafe fn load4(&self, at: usize, n: usize) -> float32x4_t;

    fn get(&self, at: usize) -> f32;
}

impl BlockScales for [f32] {
    #[inline(always)]
    unsafe fn load4(&self, at: usize, n: usize) -> float32x4_t {
        // SAFETY: this function's contract is `load4`'s.
        unsafe { load4(self, at, n) }
    }

    #[inline(always)]
    fn get(&self, at: usize) -> f32 {
        self[at]
    }
}

impl BlockScales for [u16] {
    #[inline(always)]
    unsafe fn load4(&self, at: usize, n: usize) -> float32x4_t {
        // SAFETY: the load reads `self[at..at + 4]`, in bounds by this function's contract, or the local `t`;
        // NEON (with its f16 → f32 conversion) is part of the aarch64 baseline; the bits are IEEE halves.
        unsafe {
            let halves = if n == 4 {
                vld1_u16(self.as_ptr().add(at))
            } else {
                let mut t = [0u16; 4];
                t[..n].copy_from_slice(&self[at..at + n]);
                vld1_u16(t.as_ptr())
            };
            vcvt_f32_f16(std::mem::transmute::<uint16x4_t, float16x4_t>(halves))
        }
    }

    #[inline(always)]
    fn get(&self, at: usize) -> f32 {
        f16_to_f32(self[at])
    }
}

/// Signed int8 weights of block `b` of output row `o`: elements 0–15 and 16–31.
trait IntWeights {
    /// # Safety
    /// `o` must be an output row and `b` a block of the weight the pointer was taken from (the second field is
    /// its padded row length).
    unsafe fn halves(&self, o: usize, b: usize) -> (int8x16_t, int8x16_t);
}

struct Q8(*const i8, usize);
struct Q4(*const u8, usize);

impl IntWeights for Q8 {
    #[inline(always)]
    unsafe fn halves(&self, o: usize, b: usize) -> (int8x16_t, int8x16_t) {
        // SAFETY: block `b` of row `o` is the 32 bytes at `o·k + 32b` of the `out × k` quants (`halves`'s contract);
        // NEON is part of the aarch64 baseline.
        unsafe {
            let p = self.0.add(o * self.1 + b * BLOCK);
            (vld1q_s8(p), vld1q_s8(p.add(16)))
        }
    }
}

impl IntWeights for Q4 {
    /// Element j < 16 is the low nibble of byte j, element j + 16 its high nibble; both minus 8.
    #[inline(always)]
    unsafe fn halves(&self, o: usize, b: usize) -> (int8x16_t, int8x16_t) {
        // SAFETY: block `b` of row `o` is the 16 bytes at `(o·k + 32b) / 2` of the `out × k/2` nibbles (`halves`'s
        // contract); NEON is part of the aarch64 baseline.
        unsafe {
            let v = vld1q_u8(self.0.add((o * self.1 + b * BLOCK) / 2));
            let eight = vdupq_n_s8(8);
            let lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f)));
            let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(v));
            (vsubq_s8(lo, eight), vsubq_s8(hi, eight))
        }
    }
}

/// # Safety
/// The CPU must have dotprod (reached only through `int_dotprod` and `int_i8mm`, which `dot_int8` runs for an
/// available kernel).
#[inline(always)]
unsafe fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: the CPU has `SDOT` (this function's contract); it touches only the registers named.
    unsafe {
        asm!("sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b", acc = inout(vreg) acc, a = in(vreg) a, b = in(vreg) b,
             options(pure, nomem, nostack, preserves_flags))
    };
    acc
}

/// # Safety
/// The CPU must have i8mm (reached only through `int_i8mm`, which `dot_int8` runs for an available kernel).
#[inline(always)]
unsafe fn smmla(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: the CPU has `SMMLA` (this function's contract); it touches only the registers named.
    unsafe {
        asm!("smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b", acc = inout(vreg) acc, a = in(vreg) a, b = in(vreg) b,
             options(pure, nomem, nostack, preserves_flags))
    };
    acc
}

/// Four lanes whose sum is the exact product of one block (`w0`,`w1` × `x0`,`x1`).
///
/// # Safety
/// With `SDOT`, the CPU must have dotprod (as [`sdot`]).
#[inline(always)]
unsafe fn block_dot<const SDOT: bool>(
    w0: int8x16_t,
    w1: int8x16_t,
    x0: int8x16_t,
    x1: int8x16_t,
) -> int32x4_t {
    // SAFETY: NEON is part of the aarch64 baseline; with `SDOT` the CPU has dotprod (this function's contract).
    unsafe {
        if SDOT {
            sdot(sdot(vdupq_n_s32(0), w0, x0), w1, x1)
        } else {
            // |q| ≤ 127 for activations and Q8_0, ≤ 8 for Q4_0: two products fit an i16 lane.
            let p = vmlal_high_s8(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)), w0, x0);
            let q = vmlal_high_s8(vmull_s8(vget_low_s8(w1), vget_low_s8(x1)), w1, x1);
            vpadalq_s16(vpaddlq_s16(p), q)
        }
    }
}

/// Four consecutive f32 from `s[at..]`, lanes past `n` zero.
///
/// # Safety
/// When `n == 4`, `s` must hold `at + 4` values (fewer lanes are copied through a bounds-checked slice).
#[inline(always)]
unsafe fn load4(s: &[f32], at: usize, n: usize) -> float32x4_t {
    // SAFETY: NEON is part of the aarch64 baseline; the load reads `s[at..at + 4]`, in bounds by this function's
    // contract, or the local `t`.
    unsafe {
        if n == 4 {
            vld1q_f32(s.as_ptr().add(at))
        } else {
            let mut t = [0.0f32; 4];
            t[..n].copy_from_slice(&s[at..at + n]);
            vld1q_f32(t.as_ptr())
        }
    }
}

/// `(a0 + a1) + (a2 + a3)`, the order [`crate::int8::dot_reference`] fixes.
#[inline(always)]
fn sum4(a: float32x4_t) -> f32 {
    // SAFETY: NEON is part of the aarch64 baseline; no memory is touched.
    unsafe {
        let p = vpaddq_f32(a, a);
        vgetq_lane_f32::<0>(p) + vgetq_lane_f32::<1>(p)
    }
}

/// Blocks `b0..b0+n` (n < 4, the last of a row) of output row `o` into the accumulators of rows `r0..r0+R`,
/// lane `j` ← block `b0 + j`.
///
/// # Safety
/// As [`IntWeights::halves`] for blocks `b0..b0+n` (n < 4) of row `o`; `x` must hold rows `r0..r0+R`; with
/// `SDOT` the CPU must have dotprod.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn int_group<const R: usize, const SDOT: bool, W: IntWeights, S: BlockScales + ?Sized>(
    w: &W,
    ws: &S,
    x: &QuantizedActs,
    r0: usize,
    o: usize,
    b0: usize,
    n: usize,
    acc: &mut [float32x4_t; R],
) {
    // SAFETY: with `SDOT` the CPU has dotprod; blocks `b0..b0 + n` of row `o` are in the weight and rows
    // `r0..r0 + R` of `x` hold them (this function's contract).
    unsafe {
        let (k, nb) = (x.k, x.k / BLOCK);
        let zero = vdupq_n_s8(0);
        let mut wv = [(zero, zero); 4];
        for (j, v) in wv.iter_mut().enumerate().take(n) {
            *v = w.halves(o, b0 + j);
        }
        let wsc = ws.load4(o * nb + b0, n);
        for (r, a) in acc.iter_mut().enumerate() {
            let row = r0 + r;
            let xp = x.quants.as_ptr().add(row * k + b0 * BLOCK);
            let mut d = [vdupq_n_s32(0); 4];
            for j in 0..n {
                let (x0, x1) = (
                    vld1q_s8(xp.add(j * BLOCK)),
                    vld1q_s8(xp.add(j * BLOCK + 16)),
                );
                d[j] = block_dot::<SDOT>(wv[j].0, wv[j].1, x0, x1);
            }
            let sums = vpaddq_s32(vpaddq_s32(d[0], d[1]), vpaddq_s32(d[2], d[3]));
            let xsc = load4(&x.scales, row * nb + b0, n);
            *a = vfmaq_f32(*a, vcvtq_f32_s32(sums), vmulq_f32(wsc, xsc));
        }
    }
}

/// Blocks `b0..b0+4` of output row `o` into the accumulators of rows `r0..r0+R` (the main loop: each weight
/// block is loaded and unpacked once for all rows, the per-block sums reduced pairwise as they come).
///
/// # Safety
/// As [`int_group`], for the four blocks `b0..b0+4` (`b0 + 4 ≤ x.k / 32`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn int_group4<const R: usize, const SDOT: bool, W: IntWeights, S: BlockScales + ?Sized>(
    w: &W,
    ws: &S,
    x: &QuantizedActs,
    r0: usize,
    o: usize,
    b0: usize,
    acc: &mut [float32x4_t; R],
) {
    // SAFETY: with `SDOT` the CPU has dotprod; blocks `b0..b0 + 4` of row `o` are in the weight, its scales and
    // rows `r0..r0 + R` of `x` (this function's contract).
    unsafe {
        let (k, nb) = (x.k, x.k / BLOCK);
        let xq = x.quants.as_ptr();
        let mut first = [vdupq_n_s32(0); R];
        let (a0, a1) = w.halves(o, b0);
        let (c0, c1) = w.halves(o, b0 + 1);
        for (r, f) in first.iter_mut().enumerate() {
            let xp = xq.add((r0 + r) * k + b0 * BLOCK);
            let d0 = block_dot::<SDOT>(a0, a1, vld1q_s8(xp), vld1q_s8(xp.add(16)));
            let d1 = block_dot::<SDOT>(c0, c1, vld1q_s8(xp.add(32)), vld1q_s8(xp.add(48)));
            *f = vpaddq_s32(d0, d1);
        }
        let (a0, a1) = w.halves(o, b0 + 2);
        let (c0, c1) = w.halves(o, b0 + 3);
        let wsc = ws.load4(o * nb + b0, 4);
        for (r, a) in acc.iter_mut().enumerate() {
            let xp = xq.add((r0 + r) * k + b0 * BLOCK);
            let d2 = block_dot::<SDOT>(a0, a1, vld1q_s8(xp.add(64)), vld1q_s8(xp.add(80)));
            let d3 = block_dot::<SDOT>(c0, c1, vld1q_s8(xp.add(96)), vld1q_s8(xp.add(112)));
            let sums = vpaddq_s32(first[r], vpaddq_s32(d2, d3));
            let xsc = vld1q_f32(x.scales.as_ptr().add((r0 + r) * nb + b0));
            *a = vfmaq_f32(*a, vcvtq_f32_s32(sums), vmulq_f32(wsc, xsc));
        }
    }
}

/// Rows `r0..r0+R` against output rows `o0..o1` with SDOT (or the ARMv8.0 widening multiplies).
///
/// # Safety
/// `x` must hold rows `r0..r0+R` of `x.k` values, `o0..o1` must be output rows of the weight (whose padded rows
/// are `x.k` long), and with `SDOT` the CPU must have dotprod.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn int_rows<const R: usize, const SDOT: bool, W: IntWeights, S: BlockScales + ?Sized>(
    w: &W,
    ws: &S,
    x: &QuantizedActs,
    r0: usize,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    // SAFETY: the groups of four end at `b0 + 4 ≤ nb` and the rest at `nb`, so every block is in the rows this
    // function's contract gives.
    unsafe {
        let nb = x.k / BLOCK;
        for o in o0..o1 {
            let mut acc = [vdupq_n_f32(0.0); R];
            let mut b0 = 0;
            while b0 + 4 <= nb {
                int_group4::<R, SDOT, W, S>(w, ws, x, r0, o, b0, &mut acc);
                b0 += 4;
            }
            if b0 < nb {
                int_group::<R, SDOT, W, S>(w, ws, x, r0, o, b0, nb - b0, &mut acc);
            }
            for (r, a) in acc.iter().enumerate() {
                partial[(r0 + r) * (o1 - o0) + (o - o0)] = sum4(*a);
            }
        }
    }
}

/// Block `b` of output rows `o` and `o2` against row pairs `p0..p0+P` with SMMLA: lanes
/// `[r0·o, r0·o2, r1·o, r1·o2]`, into accumulator `slot` (the block mod 4) of each pair.
///
/// # Safety
/// The CPU must have i8mm; `o`, `o2` must be output rows of the weight, `b < x.k / 32`, and `x.pairs` must hold
/// row pairs `p0..p0+P`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn smmla_block<const P: usize, W: IntWeights, S: BlockScales + ?Sized>(
    w: &W,
    ws: &S,
    x: &QuantizedActs,
    p0: usize,
    o: usize,
    o2: usize,
    b: usize,
    slot: usize,
    acc: &mut [[float32x4_t; 4]; P],
) {
    // SAFETY: the CPU has i8mm; rows `o`, `o2`, block `b` and pairs `p0..p0 + P` are in the weight and in `x`
    // (this function's contract).
    unsafe {
        let nb = x.k / BLOCK;
        let (a0, a1) = w.halves(o, b);
        let (c0, c1) = w.halves(o2, b);
        let zip1 = |a: int8x16_t, c: int8x16_t| {
            vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(c)))
        };
        let zip2 = |a: int8x16_t, c: int8x16_t| {
            vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(c)))
        };
        // 8-value chunks of both output rows side by side: the 2×8 right operand.
        let wm = [zip1(a0, c0), zip2(a0, c0), zip1(a1, c1), zip2(a1, c1)];
        let pair = [ws.get(o * nb + b), ws.get(o2 * nb + b)];
        let wsc = vcombine_f32(vld1_f32(pair.as_ptr()), vld1_f32(pair.as_ptr()));
        for (p, a) in acc.iter_mut().enumerate() {
            let at = (p0 + p) * nb + b;
            let xp = x.pairs.as_ptr().add(at * 4 * 16);
            let mut s = vdupq_n_s32(0);
            for (c, m) in wm.iter().enumerate() {
                s = smmla(s, vld1q_s8(xp.add(c * 16)), *m);
            }
            let xsc = vld1q_f32(x.pair_scales.as_ptr().add(at * 4));
            a[slot] = vfmaq_f32(a[slot], vcvtq_f32_s32(s), vmulq_f32(wsc, xsc));
        }
    }
}

/// Row pairs `p0..p0+P` against output rows `o` and `o2` (`o2 == o` for a last odd row): per pair the four
/// sums `[r0·o, r0·o2, r1·o, r1·o2]`, block `b` accumulated in slot `b mod 4`.
///
/// # Safety
/// As [`smmla_block`] for every block of rows `o` and `o2`.
#[inline(always)]
unsafe fn smmla_pairs<const P: usize, W: IntWeights, S: BlockScales + ?Sized>(
    w: &W,
    ws: &S,
    x: &QuantizedActs,
    p0: usize,
    o: usize,
    o2: usize,
) -> [float32x4_t; P] {
    // SAFETY: every `b` passed on is below `nb` (this function's contract covers the rest).
    unsafe {
        let nb = x.k / BLOCK;
        let mut acc = [[vdupq_n_f32(0.0); 4]; P];
        let mut b = 0;
        while b + 4 <= nb {
            // Unrolled by hand so that each slot is a register.
            smmla_block::<P, W, S>(w, ws, x, p0, o, o2, b, 0, &mut acc);
            smmla_block::<P, W, S>(w, ws, x, p0, o, o2, b + 1, 1, &mut acc);
            smmla_block::<P, W, S>(w, ws, x, p0, o, o2, b + 2, 2, &mut acc);
            smmla_block::<P, W, S>(w, ws, x, p0, o, o2, b + 3, 3, &mut acc);
            b += 4;
        }
        while b < nb {
            smmla_block::<P, W, S>(w, ws, x, p0, o, o2, b, b % 4, &mut acc);
            b += 1;
        }
        acc.map(|a| vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3])))
    }
}

/// Rows `r0..r0+R` (r0 even, R ≥ 2) against output rows `o0..o1` with SMMLA.
///
/// # Safety
/// The CPU must have i8mm; `x.pairs` must hold rows `r0..r0+R`, `o0..o1` must be output rows of the weight.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn smmla_rows<const R: usize, const P: usize, W: IntWeights, S: BlockScales + ?Sized>(
    w: &W,
    ws: &S,
    x: &QuantizedActs,
    r0: usize,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    // SAFETY: `o` and `o2` stay in `o0..o1` and the pairs cover rows `r0..r0 + R` (this function's contract).
    unsafe {
        let width = o1 - o0;
        let mut o = o0;
        while o < o1 {
            let o2 = (o + 1).min(o1 - 1);
            let sums = smmla_pairs::<P, W, S>(w, ws, x, r0 / 2, o, o2);
            for (p, s) in sums.iter().enumerate() {
                let mut lanes = [0.0f32; 4];
                vst1q_f32(lanes.as_mut_ptr(), *s);
                for half in 0..2 {
                    let r = 2 * p + half;
                    if r < R {
                        partial[(r0 + r) * width + (o - o0)] = lanes[2 * half];
                        if o2 != o {
                            partial[(r0 + r) * width + (o2 - o0)] = lanes[2 * half + 1];
                        }
                    }
                }
            }
            o += 2;
        }
    }
}

/// Groups of up to eight rows, each handed to `f::<R>`; expands to a `match` on the group size.
macro_rules! by_rows {
    ($rows:expr, $r:ident, $n:ident, $body:expr) => {{
        let mut $r = 0;
        while $r < $rows {
            let $n = ($rows - $r).min(8);
            $body;
            $r += $n;
        }
    }};
}

macro_rules! int_rows_match {
    ($sdot:expr, $w:expr, $ws:expr, $x:expr, $r:expr, $n:expr, $o0:expr, $o1:expr, $partial:expr) => {
        match $n {
            8 => int_rows::<8, $sdot, _, _>($w, $ws, $x, $r, $o0, $o1, $partial),
            7 => int_rows::<7, $sdot, _, _>($w, $ws, $x, $r, $o0, $o1, $partial),
            6 => int_rows::<6, $sdot, _, _>($w, $ws, $x, $r, $o0, $o1, $partial),
            5 => int_rows::<5, $sdot, _, _>($w, $ws, $x, $r, $o0, $o1, $partial),
            4 => int_rows::<4, $sdot, _, _>($w, $ws, $x, $r, $o0, $o1, $partial),
            3 => int_rows::<3, $sdot, _, _>($w, $ws, $x, $r, $o0, $o1, $partial),
            2 => int_rows::<2, $sdot, _, _>($w, $ws, $x, $r, $o0, $o1, $partial),
            _ => int_rows::<1, $sdot, _, _>($w, $ws, $x, $r, $o0, $o1, $partial),
        }
    };
}

/// # Safety
/// The CPU must have this function's features; the sizes must pass `dot_int8`'s asserts.
#[target_feature(enable = "neon")]
unsafe fn int_neon<W: IntWeights, S: BlockScales + ?Sized>(
    w: &W,
    ws: &S,
    x: &QuantizedActs,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    // SAFETY: this function's features are enabled; rows `r..r + n` are within `x.rows`, and the outputs and
    // sizes are this function's contract.
    unsafe {
        by_rows!(
            x.rows,
            r,
            n,
            int_rows_match!(false, w, ws, x, r, n, o0, o1, partial)
        );
    }
}

/// # Safety
/// The CPU must have this function's features; the sizes must pass `dot_int8`'s asserts.
#[target_feature(enable = "neon,dotprod")]
unsafe fn int_dotprod<W: IntWeights, S: BlockScales + ?Sized>(
    w: &W,
    ws: &S,
    x: &QuantizedActs,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    // SAFETY: this function's features are enabled; rows `r..r + n` are within `x.rows`, and the outputs and
    // sizes are this function's contract.
    unsafe {
        by_rows!(
            x.rows,
            r,
            n,
            int_rows_match!(true, w, ws, x, r, n, o0, o1, partial)
        );
    }
}

/// # Safety
/// The CPU must have this function's features; the sizes must pass `dot_int8`'s asserts.
#[target_feature(enable = "neon,dotprod,i8mm")]
unsafe fn int_i8mm<W: IntWeights, S: BlockScales + ?Sized>(
    w: &W,
    ws: &S,
    x: &QuantizedActs,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    // SAFETY: this function's features are enabled; rows `r..r + n` are within `x.rows`, and the outputs and
    // sizes are this function's contract.
    unsafe {
        by_rows!(
            x.rows,
            r,
            n,
            match n {
                8 => smmla_rows::<8, 4, W, S>(w, ws, x, r, o0, o1, partial),
                7 => smmla_rows::<7, 4, W, S>(w, ws, x, r, o0, o1, partial),
                6 => smmla_rows::<6, 3, W, S>(w, ws, x, r, o0, o1, partial),
                5 => smmla_rows::<5, 3, W, S>(w, ws, x, r, o0, o1, partial),
                4 => smmla_rows::<4, 2, W, S>(w, ws, x, r, o0, o1, partial),
                3 => smmla_rows::<3, 2, W, S>(w, ws, x, r, o0, o1, partial),
                2 => smmla_rows::<2, 1, W, S>(w, ws, x, r, o0, o1, partial),
                _ => int_rows::<1, true, W, S>(w, ws, x, r, o0, o1, partial),
            }
        );
    }
}

/// `partial[r][o − o0] = Σ_b (w·x)_b · d_w · d_x` for Q8_0/Q4_0 `w`, with `kernel` (which this CPU must have;
/// [`Kernel::I8mm`] needs `x` quantised with pairs when it has two rows or more).
pub(crate) fn dot_int8(
    kernel: Kernel,
    w: &LinearWeight,
    x: &QuantizedActs,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    assert!(
        available().contains(&kernel),
        "{kernel:?} kernel on a CPU without it"
    );
    assert!(x.k == w.padded_in && o1 <= w.out_features && partial.len() >= x.rows * (o1 - o0));
    assert!(kernel != Kernel::I8mm || x.rows < 2 || x.pairs.len() >= x.rows.div_ceil(2) * 2 * x.k);
    let k = w.padded_in;
    macro_rules! with_scales {
        ($wt:expr, $ws:expr) => {
            // SAFETY: the CPU has the kernel's features (checked above); the sizes were checked above.
            unsafe {
                match kernel {
                    Kernel::Neon => int_neon(&$wt, $ws, x, o0, o1, partial),
                    Kernel::Dotprod => int_dotprod(&$wt, $ws, x, o0, o1, partial),
                    Kernel::I8mm => int_i8mm(&$wt, $ws, x, o0, o1, partial),
                }
            }
        };
    }
    macro_rules! run {
        ($wt:expr) => {
            match weight_scales(w) {
                Scales::F32(ws) => with_scales!($wt, ws.as_slice()),
                Scales::Half(ws) => with_scales!($wt, ws.as_slice()),
            }
        };
    }
    match &w.storage {
        Storage::Q8_0 { quants, .. } => run!(Q8(quants.as_ptr(), k)),
        Storage::Q4_0 { nibbles, .. } => run!(Q4(nibbles.as_ptr(), k)),
        _ => unreachable!("integer dot products are for Q8_0/Q4_0 weights"),
    }
}

/// Eight consecutive weights of output row `o` from element `i` (a multiple of 8), widened to f32.
trait FloatWeights {
    /// # Safety
    /// `o` must be an output row of the weight the pointer was taken from and `i + 8 ≤` its padded row length.
    unsafe fn load8(&self, o: usize, i: usize) -> (float32x4_t, float32x4_t);
}

struct F32W(*const f32, usize);
struct Bf16W(*const u16, usize);
struct F16W(*const u16, usize);
struct Q8F<'a>(*const i8, &'a Scales, usize);
struct Q4F<'a>(*const u8, &'a Scales, usize);

impl FloatWeights for F32W {
    #[inline(always)]
    unsafe fn load8(&self, o: usize, i: usize) -> (float32x4_t, float32x4_t) {
        // SAFETY: row `o`'s elements `i..i + 8` are inside the `out × k` weights (`load8`'s contract); NEON is
        // part of the aarch64 baseline.
        unsafe {
            let p = self.0.add(o * self.1 + i);
            (vld1q_f32(p), vld1q_f32(p.add(4)))
        }
    }
}

impl FloatWeights for Bf16W {
    #[inline(always)]
    unsafe fn load8(&self, o: usize, i: usize) -> (float32x4_t, float32x4_t) {
        // SAFETY: row `o`'s elements `i..i + 8` are inside the `out × k` weights (`load8`'s contract); NEON is
        // part of the aarch64 baseline.
        unsafe {
            let v = vld1q_u16(self.0.add(o * self.1 + i));
            (
                vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(v))),
                vreinterpretq_f32_u32(vshll_high_n_u16::<16>(v)),
            )
        }
    }
}

impl FloatWeights for F16W {
    #[inline(always)]
    unsafe fn load8(&self, o: usize, i: usize) -> (float32x4_t, float32x4_t) {
        // SAFETY: row `o`'s elements `i..i + 8` are inside the `out × k` weights (`load8`'s contract); NEON is
        // part of the aarch64 baseline.
        unsafe {
            let v = vld1q_u16(self.0.add(o * self.1 + i));
            // SAFETY: same size; the bits are IEEE halves.
            let lo: float16x4_t = std::mem::transmute(vget_low_u16(v));
            (
                vcvt_f32_f16(lo),
                vcvt_high_f32_f16(std::mem::transmute::<uint16x8_t, float16x8_t>(v)),
            )
        }
    }
}

impl FloatWeights for Q8F<'_> {
    #[inline(always)]
    unsafe fn load8(&self, o: usize, i: usize) -> (float32x4_t, float32x4_t) {
        // SAFETY: row `o`'s elements `i..i + 8` are inside the `out × k` weights (`load8`'s contract); NEON is
        // part of the aarch64 baseline.
        unsafe {
            let s = vdupq_n_f32(self.1.get((o * self.2 + i) / BLOCK));
            let q = vmovl_s8(vld1_s8(self.0.add(o * self.2 + i)));
            let lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(q)));
            let hi = vcvtq_f32_s32(vmovl_high_s16(q));
            (vmulq_f32(lo, s), vmulq_f32(hi, s))
        }
    }
}

impl FloatWeights for Q4F<'_> {
    #[inline(always)]
    unsafe fn load8(&self, o: usize, i: usize) -> (float32x4_t, float32x4_t) {
        // SAFETY: `i` is a multiple of 8, so the 8 bytes at `j % 16` lie in block `b`'s 16 bytes, which are in the
        // weights (`load8`'s contract); NEON is part of the aarch64 baseline.
        unsafe {
            let (b, j) = ((o * self.2 + i) / BLOCK, i % BLOCK);
            let s = vdupq_n_f32(self.1.get(b));
            let bytes = vld1_u8(self.0.add(b * BLOCK / 2 + j % 16));
            let nib = if j < 16 {
                vand_u8(bytes, vdup_n_u8(0x0f))
            } else {
                vshr_n_u8::<4>(bytes)
            };
            let q = vsubq_s16(vreinterpretq_s16_u16(vmovl_u8(nib)), vdupq_n_s16(8));
            let lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(q)));
            let hi = vcvtq_f32_s32(vmovl_high_s16(q));
            (vmulq_f32(lo, s), vmulq_f32(hi, s))
        }
    }
}

/// Rows `r0..r0+R` against output row `o`: each weight block is widened once for the `R` rows, two
/// accumulators per row.
///
/// # Safety
/// `o` must be an output row of the weight, whose padded rows are `k` (a multiple of 8) long, and `x` must hold
/// rows `r0..r0+R` of `k` values.
#[inline(always)]
unsafe fn float_row<const R: usize, W: FloatWeights>(
    w: &W,
    x: &[f32],
    k: usize,
    r0: usize,
    o: usize,
) -> [f32; R] {
    // SAFETY: `i + 8 ≤ k`, so the weight loads stay in row `o` and the activation loads in rows `r0..r0 + R`
    // (this function's contract).
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); 2]; R];
        for i in (0..k).step_by(8) {
            let (w0, w1) = w.load8(o, i);
            for (r, a) in acc.iter_mut().enumerate() {
                let xp = x.as_ptr().add((r0 + r) * k + i);
                a[0] = vfmaq_f32(a[0], w0, vld1q_f32(xp));
                a[1] = vfmaq_f32(a[1], w1, vld1q_f32(xp.add(4)));
            }
        }
        acc.map(|a| vaddvq_f32(vaddq_f32(a[0], a[1])))
    }
}

/// # Safety
/// As [`float_row`] for every output row `o0..o1`.
#[inline(always)]
unsafe fn float_rows<const R: usize, W: FloatWeights>(
    w: &W,
    x: &[f32],
    k: usize,
    r0: usize,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    // SAFETY: every `o` is in `o0..o1` (this function's contract).
    unsafe {
        for o in o0..o1 {
            for (r, v) in float_row::<R, W>(w, x, k, r0, o).iter().enumerate() {
                partial[(r0 + r) * (o1 - o0) + (o - o0)] = *v;
            }
        }
    }
}

/// # Safety
/// `x` must hold `rows` rows of `k` values (the weight's padded row length), `o0..o1` must be output rows of the
/// weight, and `partial` must hold `rows × (o1 − o0)` values.
#[target_feature(enable = "neon")]
unsafe fn float_all<W: FloatWeights>(
    w: &W,
    x: &[f32],
    k: usize,
    rows: usize,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    // SAFETY: NEON is enabled; rows `r..r + n` are within `rows`, and the outputs and sizes are this function's
    // contract.
    unsafe {
        by_rows!(
            rows,
            r,
            n,
            match n {
                8 => float_rows::<8, W>(w, x, k, r, o0, o1, partial),
                7 => float_rows::<7, W>(w, x, k, r, o0, o1, partial),
                6 => float_rows::<6, W>(w, x, k, r, o0, o1, partial),
                5 => float_rows::<5, W>(w, x, k, r, o0, o1, partial),
                4 => float_rows::<4, W>(w, x, k, r, o0, o1, partial),
                3 => float_rows::<3, W>(w, x, k, r, o0, o1, partial),
                2 => float_rows::<2, W>(w, x, k, r, o0, o1, partial),
                _ => float_rows::<1, W>(w, x, k, r, o0, o1, partial),
            }
        );
    }
}

/// `partial[r][o − o0] = Σ_i x[r][i] · w[o][i]` on f32 activations, any format.
pub(crate) fn dot_float(
    w: &LinearWeight,
    x: &[f32],
    rows: usize,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    let k = w.padded_in;
    assert!(x.len() >= rows * k && partial.len() >= rows * (o1 - o0) && o1 <= w.out_features);
    // SAFETY: NEON is part of the aarch64 baseline; the sizes were checked above.
    unsafe {
        match &w.storage {
            Storage::F32(d) => float_all(&F32W(d.as_ptr(), k), x, k, rows, o0, o1, partial),
            Storage::BF16(d) => float_all(&Bf16W(d.as_ptr(), k), x, k, rows, o0, o1, partial),
            Storage::F16(d) => float_all(&F16W(d.as_ptr(), k), x, k, rows, o0, o1, partial),
            Storage::Q8_0 { scales, quants } => float_all(
                &Q8F(quants.as_ptr(), scales, k),
                x,
                k,
                rows,
                o0,
                o1,
                partial,
            ),
            Storage::Q4_0 { scales, nibbles } => float_all(
                &Q4F(nibbles.as_ptr(), scales, k),
                x,
                k,
                rows,
                o0,
                o1,
                partial,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use kazeia_backend_abi::WeightFormat;

    use super::*;
    use crate::int8::{
        check_layers_give_the_reference_plus_bias, dot_reference, test_values as values,
    };

    /// Awkward shapes: fewer blocks than a group of four, partial last groups, inputs padded to a block, odd
    /// and single output rows, 1–9 and 17 activation rows (partial groups of 8 and odd SMMLA pairs).
    const SHAPES: [(usize, usize); 6] = [(1, 32), (3, 96), (7, 70), (66, 160), (5, 288), (2, 1000)];
    const ROWS: [usize; 11] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17];

    #[test]
    fn the_kernel_in_use_is_the_best_this_cpu_has() {
        let names: Vec<&str> = available().iter().map(|k| k.name()).collect();
        eprintln!(
            "aarch64 int8 kernels available: {names:?}, selected: {}",
            selected().name()
        );
        if std::env::var_os("KAZEIA_ARM_KERNEL").is_none() {
            assert_eq!(selected(), *available().last().unwrap());
        }
        // tools/test-aarch64.sh runs this under several QEMU_CPU models and says what each must offer.
        if let Ok(expected) = std::env::var("KAZEIA_EXPECT_ARM_KERNELS") {
            assert_eq!(names.join(","), expected, "kernels found on this CPU model");
        }
    }

    /// `w` with its block scales held as `f32` (as for a weight with a scale that is no half).
    fn with_f32_scales(mut w: LinearWeight) -> LinearWeight {
        match &mut w.storage {
            Storage::Q8_0 { scales, .. } | Storage::Q4_0 { scales, .. } => {
                *scales = Scales::F32(scales.to_f32().into_owned())
            }
            _ => unreachable!("a quantised weight"),
        }
        w
    }

    /// Q8_0/Q4_0 scales are held as halves (18 bytes a Q4_0 block, 34 a Q8_0 one, as `resident_block_bytes`
    /// says) unless one of them is no half, and the layer computes the same either way.
    #[test]
    fn quantised_scales_are_held_as_halves_unless_one_is_not() {
        let (out, inp) = (8, 96);
        for format in [WeightFormat::Q8_0, WeightFormat::Q4_0] {
            let mut w = values(out * inp, 5);
            let halves = LinearWeight::new(&w, out, inp, None, format);
            assert_eq!(crate::linear::half_scales(&halves), Some(true));
            let blocks = (out * inp / BLOCK) as u64;
            let block_bytes = crate::linear::resident_block_bytes(format).unwrap();
            assert_eq!(halves.bytes() as u64, blocks * block_bytes);
            assert_eq!(
                block_bytes,
                if format == WeightFormat::Q4_0 { 18 } else { 34 }
            );
            // A block of tiny values: its scale is under the smallest normal half.
            w[..BLOCK].iter_mut().for_each(|v| *v *= 1e-7);
            let tiny = LinearWeight::new(&w, out, inp, None, format);
            assert_eq!(crate::linear::half_scales(&tiny), Some(false));
            let x = values(3 * inp, 6);
            let forward = |lw: &LinearWeight| {
                let mut y = vec![0.0; 3 * out];
                lw.forward(&x, 3, &mut y, gemm::Parallelism::None);
                y
            };
            assert_eq!(forward(&halves), forward(&with_f32_scales(halves)));
        }
    }

    #[test]
    fn every_int8_kernel_equals_the_scalar_reference_bit_for_bit() {
        let layouts = [(|w| w) as fn(LinearWeight) -> LinearWeight, with_f32_scales];
        for (format, layout) in [WeightFormat::Q8_0, WeightFormat::Q4_0]
            .into_iter()
            .flat_map(|f| layouts.map(|l| (f, l)))
        {
            for (out, inp) in SHAPES {
                let w = values(out * inp, 1 + out as u32);
                let lw = layout(LinearWeight::new(&w, out, inp, None, format));
                let k = lw.padded_in;
                for rows in ROWS {
                    let x = values(rows * inp, 7 + rows as u32);
                    let mut padded = vec![0.0; rows * k];
                    for r in 0..rows {
                        padded[r * k..r * k + inp].copy_from_slice(&x[r * inp..(r + 1) * inp]);
                    }
                    let q = QuantizedActs::new(&padded, rows, k, true);
                    // The whole output, and a range that starts and ends off the pair boundaries.
                    for (o0, o1) in [(0, out), (out / 3, out - out / 4)] {
                        if o0 >= o1 {
                            continue;
                        }
                        let mut want = vec![0.0f32; rows * (o1 - o0)];
                        dot_reference(&lw, &q, o0, o1, &mut want);
                        for &kernel in available() {
                            let mut got = vec![f32::NAN; rows * (o1 - o0)];
                            dot_int8(kernel, &lw, &q, o0, o1, &mut got);
                            let bits =
                                |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                            assert_eq!(
                                bits(&got),
                                bits(&want),
                                "{format} {kernel:?} out {out} in {inp} rows {rows} outputs {o0}..{o1}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn linear_layers_on_the_int8_path_give_the_reference_plus_bias() {
        check_layers_give_the_reference_plus_bias(&[1, 2, 5, 8, 11]);
    }

    #[test]
    fn float_kernels_match_the_portable_kernel() {
        for format in [
            WeightFormat::F32,
            WeightFormat::F16,
            WeightFormat::BF16,
            WeightFormat::Q8_0,
            WeightFormat::Q4_0,
        ] {
            for (out, inp) in SHAPES {
                let w = values(out * inp, 11);
                let lw = LinearWeight::new(&w, out, inp, None, format);
                let k = lw.padded_in;
                for rows in [1, 3, 8, 9] {
                    let x = values(rows * k, 13 + rows as u32);
                    let mut neon = vec![0.0; rows * out];
                    dot_float(&lw, &x, rows, 0, out, &mut neon);
                    let mut portable = vec![0.0; rows * out];
                    crate::linear::dot_portable(&lw, &x, rows, 0, out, &mut portable);
                    // Same products, summed in another order (and fused): a few ulps of the sum of magnitudes.
                    for r in 0..rows {
                        for o in 0..out {
                            let magnitude: f32 = (0..k)
                                .map(|i| (x[r * k + i] * crate::linear::weight_at(&lw, o, i)).abs())
                                .sum();
                            let (a, b) = (neon[r * out + o], portable[r * out + o]);
                            assert!(
                                (a - b).abs() <= 4e-6 * magnitude,
                                "{format} {out}x{inp} rows {rows}: {a} vs {b} (magnitude {magnitude})"
                            );
                        }
                    }
                }
            }
        }
    }
}
