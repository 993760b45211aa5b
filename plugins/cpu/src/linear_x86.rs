//! x86 kernels for the decode-and-dot path of quantised linear layers: each block of 32 weights is widened to
//! f32 in registers (BF16 by a shift and a mask of one 64-byte load, its even and odd weights against
//! activations reordered the same way once a call; F16 by `vcvtph2ps`; Q8_0/Q4_0 by sign/zero extension and one
//! multiply by the block scale) and multiplied into up to eight rows of activations at once.

use std::arch::x86_64::*;

use super::linear::{reordered_once, LinearWeight, Reordered, Storage, BLOCK};
use crate::aligned::Aligned;

/// Widens 16 consecutive weights starting at element `i` of output row `o` to f32 (AVX-512).
trait Lanes16 {
    /// # Safety
    /// AVX-512F/BW and F16C must be enabled in the caller (these kernels run only inside [`dot_avx512`]);
    /// `o` must be an output row of the weight and `i + 16 ≤` its padded row length, `i` a multiple of 16.
    unsafe fn load16(&self, o: usize, i: usize, scale: __m512) -> __m512;
    /// The 32 weights of block `b` of row `o` as two vectors: weights 0–15 and 16–31, or, for a layout that
    /// sets [`Lanes16::EVEN_ODD`], the even-numbered weights and the odd-numbered ones.
    ///
    /// # Safety
    /// As [`Lanes16::load16`] for both halves of the block.
    #[inline(always)]
    unsafe fn load32(&self, o: usize, b: usize, scale: __m512) -> (__m512, __m512) {
        // SAFETY: this function's contract.
        unsafe {
            (
                self.load16(o, b * BLOCK, scale),
                self.load16(o, b * BLOCK + 16, scale),
            )
        }
    }
    /// Whether [`Lanes16::load32`] splits a block into even and odd weights (the activations are then laid out
    /// the same way, [`even_odd`]).
    const EVEN_ODD: bool = false;
    fn scale(&self, o: usize, b: usize) -> f32;
    /// Where weight `i` of row `o` is stored (for prefetching: computed, never read here).
    fn addr(&self, o: usize, i: usize) -> *const u8;
}

struct F32<'a>(&'a [f32], usize);
struct Bf16<'a>(&'a [u16], usize);
struct F16<'a>(&'a [u16], usize);
struct Q8<'a>(&'a [f32], &'a [i8], usize);
struct Q4<'a>(&'a [f32], &'a [u8], usize);

impl Lanes16 for F32<'_> {
    fn addr(&self, o: usize, i: usize) -> *const u8 {
        self.0.as_ptr().wrapping_add(o * self.1 + i).cast()
    }
    #[inline(always)]
    unsafe fn load16(&self, o: usize, i: usize, _: __m512) -> __m512 {
        // SAFETY: the caller runs with AVX-512 enabled and `o`, `i` in range (`load16`'s contract), so the 16
        // weights read are inside the row.
        unsafe { _mm512_loadu_ps(self.0.as_ptr().add(o * self.1 + i)) }
    }
    fn scale(&self, _: usize, _: usize) -> f32 {
        1.0
    }
}

impl Lanes16 for Bf16<'_> {
    fn addr(&self, o: usize, i: usize) -> *const u8 {
        self.0.as_ptr().wrapping_add(o * self.1 + i).cast()
    }
    /// One load and two ops a block: a bf16 is the top half of its f32, so the even weights (the low halves of
    /// the 32-bit lanes) are shifted up and the odd ones (the high halves) masked in place.
    #[inline(always)]
    unsafe fn load32(&self, o: usize, b: usize, _: __m512) -> (__m512, __m512) {
        // SAFETY: the caller runs with AVX-512 enabled and `o`, `b` in range (`load32`'s contract), so the 32
        // weights read are inside the row.
        unsafe {
            let v = _mm512_loadu_si512(self.0.as_ptr().add(o * self.1 + b * BLOCK).cast());
            let even = _mm512_slli_epi32::<16>(v);
            let odd = _mm512_and_si512(v, _mm512_set1_epi32(0xffff_0000u32 as i32));
            (_mm512_castsi512_ps(even), _mm512_castsi512_ps(odd))
        }
    }
    const EVEN_ODD: bool = true;
    #[inline(always)]
    unsafe fn load16(&self, o: usize, i: usize, _: __m512) -> __m512 {
        // SAFETY: the caller runs with AVX-512 enabled and `o`, `i` in range (`load16`'s contract), so the 16
        // weights read are inside the row.
        unsafe {
            let p = self.0.as_ptr().add(o * self.1 + i) as *const __m256i;
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                _mm256_loadu_si256(p),
            )))
        }
    }
    fn scale(&self, _: usize, _: usize) -> f32 {
        1.0
    }
}

impl Lanes16 for F16<'_> {
    fn addr(&self, o: usize, i: usize) -> *const u8 {
        self.0.as_ptr().wrapping_add(o * self.1 + i).cast()
    }
    #[inline(always)]
    unsafe fn load16(&self, o: usize, i: usize, _: __m512) -> __m512 {
        // SAFETY: the caller runs with AVX-512 enabled and `o`, `i` in range (`load16`'s contract), so the 16
        // weights read are inside the row.
        unsafe {
            let p = self.0.as_ptr().add(o * self.1 + i) as *const __m256i;
            _mm512_cvtph_ps(_mm256_loadu_si256(p))
        }
    }
    fn scale(&self, _: usize, _: usize) -> f32 {
        1.0
    }
}

impl Lanes16 for Q8<'_> {
    fn addr(&self, o: usize, i: usize) -> *const u8 {
        self.1.as_ptr().wrapping_add(o * self.2 + i).cast()
    }
    #[inline(always)]
    unsafe fn load16(&self, o: usize, i: usize, scale: __m512) -> __m512 {
        // SAFETY: the caller runs with AVX-512 enabled and `o`, `i` in range (`load16`'s contract), so the 16
        // weights read are inside the row.
        unsafe {
            let p = self.1.as_ptr().add(o * self.2 + i) as *const __m128i;
            _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p))),
                scale,
            )
        }
    }
    #[inline(always)]
    fn scale(&self, o: usize, b: usize) -> f32 {
        self.0[o * (self.2 / BLOCK) + b]
    }
}

impl Lanes16 for Q4<'_> {
    fn addr(&self, o: usize, i: usize) -> *const u8 {
        self.1.as_ptr().wrapping_add((o * self.2 + i) / 2)
    }
    /// Element j (j < 16) of a block is the low nibble of byte j, element j + 16 its high nibble.
    #[inline(always)]
    unsafe fn load16(&self, o: usize, i: usize, scale: __m512) -> __m512 {
        let block_start = i - i % BLOCK;
        // SAFETY: the caller runs with AVX-512 enabled and `o`, `i` in range (`load16`'s contract), so the 16
        // bytes of the block read are inside the row.
        unsafe {
            let p = self.1.as_ptr().add((o * self.2 + block_start) / 2) as *const __m128i;
            let bytes = _mm_loadu_si128(p);
            let nibbles = if i.is_multiple_of(BLOCK) {
                _mm_and_si128(bytes, _mm_set1_epi8(0x0f))
            } else {
                _mm_and_si128(_mm_srli_epi16::<4>(bytes), _mm_set1_epi8(0x0f))
            };
            let centred = _mm512_sub_epi32(_mm512_cvtepu8_epi32(nibbles), _mm512_set1_epi32(8));
            _mm512_mul_ps(_mm512_cvtepi32_ps(centred), scale)
        }
    }
    #[inline(always)]
    fn scale(&self, o: usize, b: usize) -> f32 {
        self.0[o * (self.2 / BLOCK) + b]
    }
}

/// How far ahead of the weight stream [`dot_row`] prefetches.
const PREFETCH_BYTES: usize = 4096;

/// Rows `r0..r0+R` against output row `o`: each weight block is decoded once for the `R` rows; two
/// accumulators per row keep the FMAs independent. (Several output rows at once — more weight streams in
/// flight — measured 2× slower here.)
///
/// # Safety
/// As [`Lanes16::load16`] for every block of row `o`; `x` must hold rows `r0..r0+R` of `k` values, `k` the
/// weight's padded row length (a multiple of [`BLOCK`]).
#[inline(always)]
unsafe fn dot_row<const R: usize, L: Lanes16>(
    l: &L,
    x: &[f32],
    k: usize,
    r0: usize,
    o: usize,
) -> [f32; R] {
    // SAFETY: AVX-512 is enabled in the caller (this function's contract); `b * BLOCK + 32 ≤ k`, so the weight
    // loads stay in row `o` and the activation loads in row `r0 + r`, which `x` holds.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        for b in 0..k / BLOCK {
            // A prefetch reads nothing the program sees, wherever it points (past the row: the next one's).
            _mm_prefetch::<_MM_HINT_T0>(l.addr(o, b * BLOCK).wrapping_add(PREFETCH_BYTES).cast());
            let scale = _mm512_set1_ps(l.scale(o, b));
            let (w0, w1) = l.load32(o, b, scale);
            for (r, a) in acc.iter_mut().enumerate() {
                let xp = x.as_ptr().add((r0 + r) * k + b * BLOCK);
                a[0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xp), a[0]);
                a[1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xp.add(16)), a[1]);
            }
        }
        let mut out = [0.0; R];
        for (o, a) in out.iter_mut().zip(&acc) {
            *o = _mm512_reduce_add_ps(_mm512_add_ps(a[0], a[1]));
        }
        out
    }
}

/// # Safety
/// As [`dot_row`] for every output row `o0..o1`.
#[inline(always)]
unsafe fn group<const R: usize, L: Lanes16>(
    l: &L,
    x: &[f32],
    k: usize,
    r0: usize,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    let width = o1 - o0;
    for o in o0..o1 {
        // SAFETY: `o` is in `o0..o1` (this function's contract).
        let sums = unsafe { dot_row::<R, L>(l, x, k, r0, o) };
        for (r, v) in sums.iter().enumerate() {
            partial[(r0 + r) * width + (o - o0)] = *v;
        }
    }
}

/// # Safety
/// As [`dot_row`] for every output row `o0..o1`, with `x` holding `rows` rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // the call's operands and its task's output rows
unsafe fn rows<L: Lanes16>(
    l: &L,
    x: &[f32],
    reordered: &Reordered,
    k: usize,
    rows: usize,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    let mut own = None;
    let x = if L::EVEN_ODD {
        // SAFETY: AVX-512 is enabled in the caller (as `dot_row` requires), and so on this CPU.
        reordered_once(reordered, &mut own, || unsafe { even_odd(&x[..rows * k]) })
    } else {
        x
    };
    let mut r = 0;
    while r < rows {
        let n = (rows - r).min(8);
        // SAFETY: rows `r..r + n` are within the `rows` rows `x` holds (this function's contract).
        unsafe {
            match n {
                8 => group::<8, L>(l, x, k, r, o0, o1, partial),
                7 => group::<7, L>(l, x, k, r, o0, o1, partial),
                6 => group::<6, L>(l, x, k, r, o0, o1, partial),
                5 => group::<5, L>(l, x, k, r, o0, o1, partial),
                4 => group::<4, L>(l, x, k, r, o0, o1, partial),
                3 => group::<3, L>(l, x, k, r, o0, o1, partial),
                2 => group::<2, L>(l, x, k, r, o0, o1, partial),
                _ => group::<1, L>(l, x, k, r, o0, o1, partial),
            }
        }
        r += n;
    }
}

/// `x` with each block of 32 values reordered as its 16 even-numbered values, then its 16 odd ones: the order
/// in which [`Lanes16::load32`] gives a block of an [`Lanes16::EVEN_ODD`] layout, in aligned lines.
/// Two permutes a block, once per linear call (its tasks share the result through [`Reordered`]).
#[target_feature(enable = "avx512f")]
fn even_odd(x: &[f32]) -> Aligned<f32> {
    let mut out = Aligned::zeroed(x.len());
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (dst, src) in out.chunks_exact_mut(BLOCK).zip(x.chunks_exact(BLOCK)) {
        // SAFETY: `src` holds 32 values (`chunks_exact`).
        let (a, b) = unsafe {
            (
                _mm512_loadu_ps(src.as_ptr()),
                _mm512_loadu_ps(src.as_ptr().add(16)),
            )
        };
        // SAFETY: `dst` holds 32 values, from a line boundary (`Aligned`, blocks of 128 bytes).
        unsafe {
            _mm512_store_ps(dst.as_mut_ptr(), _mm512_permutex2var_ps(a, even, b));
            _mm512_store_ps(dst.as_mut_ptr().add(16), _mm512_permutex2var_ps(a, odd, b));
        }
    }
    out
}

/// `partial[r][o − o0] = Σ_i x[r][i] · w[o][i]` with AVX-512.
///
/// # Safety
/// The CPU must support AVX-512F/BW, F16C and FMA; `x` holds `rows` rows of `w.padded_in` values; `reordered`
/// is shared only by calls on the same `x` and rows (one linear call's tasks).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub unsafe fn dot_avx512(
    w: &LinearWeight,
    x: &[f32],
    reordered: &Reordered,
    n: usize,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    let k = w.padded_in;
    assert!(x.len() >= n * k && partial.len() >= n * (o1 - o0));
    assert!(o1 <= w.out_features);
    // SAFETY: the features are enabled here (the caller detected them); the asserts above and the storage's
    // `out_features × padded_in` layout keep every row and block index in range.
    unsafe {
        match &w.storage {
            Storage::BF16(d) => rows(&Bf16(d, k), x, reordered, k, n, o0, o1, partial),
            Storage::F16(d) => rows(&F16(d, k), x, reordered, k, n, o0, o1, partial),
            // Scales stay f32 on x86 (only the VNNI layout holds halves): borrowed, not converted.
            Storage::Q8_0 { scales, quants } => rows(
                &Q8(&scales.to_f32(), quants, k),
                x,
                reordered,
                k,
                n,
                o0,
                o1,
                partial,
            ),
            Storage::Q4_0 { scales, nibbles } => rows(
                &Q4(&scales.to_f32(), nibbles, k),
                x,
                reordered,
                k,
                n,
                o0,
                o1,
                partial,
            ),
            Storage::F32(d) => rows(&F32(d, k), x, reordered, k, n, o0, o1, partial),
            Storage::Packed(_) => {
                unreachable!("packed weights take the portable loop in dispatch_dot")
            }
        }
    }
}
