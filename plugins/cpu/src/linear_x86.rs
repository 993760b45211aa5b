//! x86 kernels for the decode-and-dot path of quantised linear layers: each block of 32 weights is widened to
//! f32 in registers (BF16 by a shift, F16 by `vcvtph2ps`, Q8_0/Q4_0 by sign/zero extension and one multiply by
//! the block scale) and multiplied into up to four rows of activations at once.

use std::arch::x86_64::*;

use super::linear::{LinearWeight, Storage, BLOCK};

/// Widens 16 consecutive weights starting at element `i` of output row `o` to f32 (AVX-512).
trait Lanes16 {
    unsafe fn load16(&self, o: usize, i: usize, scale: __m512) -> __m512;
    fn scale(&self, o: usize, b: usize) -> f32;
}

struct Bf16<'a>(&'a [u16], usize);
struct F16<'a>(&'a [u16], usize);
struct Q8<'a>(&'a [f32], &'a [i8], usize);
struct Q4<'a>(&'a [f32], &'a [u8], usize);

impl Lanes16 for Bf16<'_> {
    #[inline(always)]
    unsafe fn load16(&self, o: usize, i: usize, _: __m512) -> __m512 {
        let p = self.0.as_ptr().add(o * self.1 + i) as *const __m256i;
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
            _mm256_loadu_si256(p),
        )))
    }
    fn scale(&self, _: usize, _: usize) -> f32 {
        1.0
    }
}

impl Lanes16 for F16<'_> {
    #[inline(always)]
    unsafe fn load16(&self, o: usize, i: usize, _: __m512) -> __m512 {
        let p = self.0.as_ptr().add(o * self.1 + i) as *const __m256i;
        _mm512_cvtph_ps(_mm256_loadu_si256(p))
    }
    fn scale(&self, _: usize, _: usize) -> f32 {
        1.0
    }
}

impl Lanes16 for Q8<'_> {
    #[inline(always)]
    unsafe fn load16(&self, o: usize, i: usize, scale: __m512) -> __m512 {
        let p = self.1.as_ptr().add(o * self.2 + i) as *const __m128i;
        _mm512_mul_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p))),
            scale,
        )
    }
    #[inline(always)]
    fn scale(&self, o: usize, b: usize) -> f32 {
        self.0[o * (self.2 / BLOCK) + b]
    }
}

impl Lanes16 for Q4<'_> {
    /// Element j (j < 16) of a block is the low nibble of byte j, element j + 16 its high nibble.
    #[inline(always)]
    unsafe fn load16(&self, o: usize, i: usize, scale: __m512) -> __m512 {
        let block_start = i - i % BLOCK;
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
    #[inline(always)]
    fn scale(&self, o: usize, b: usize) -> f32 {
        self.0[o * (self.2 / BLOCK) + b]
    }
}

/// Rows `r0..r0+R` against output rows `o..o+O`: every weight block is decoded once for the `R` rows, and the
/// `O × R × 2` accumulators are independent so the FMAs pipeline instead of waiting on each other.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const O: usize, const R: usize, L: Lanes16>(
    l: &L,
    x: &[f32],
    k: usize,
    r0: usize,
    o: usize,
    o0: usize,
    width: usize,
    partial: &mut [f32],
) {
    let mut acc = [[[_mm512_setzero_ps(); 2]; R]; O];
    for b in 0..k / BLOCK {
        let mut xs = [[_mm512_setzero_ps(); 2]; R];
        for (r, xr) in xs.iter_mut().enumerate() {
            let xp = x.as_ptr().add((r0 + r) * k + b * BLOCK);
            *xr = [_mm512_loadu_ps(xp), _mm512_loadu_ps(xp.add(16))];
        }
        for (j, acc_o) in acc.iter_mut().enumerate() {
            let scale = _mm512_set1_ps(l.scale(o + j, b));
            let w = [
                l.load16(o + j, b * BLOCK, scale),
                l.load16(o + j, b * BLOCK + 16, scale),
            ];
            for (acc_r, xr) in acc_o.iter_mut().zip(&xs) {
                acc_r[0] = _mm512_fmadd_ps(w[0], xr[0], acc_r[0]);
                acc_r[1] = _mm512_fmadd_ps(w[1], xr[1], acc_r[1]);
            }
        }
    }
    for (j, acc_o) in acc.iter().enumerate() {
        for (r, acc_r) in acc_o.iter().enumerate() {
            partial[(r0 + r) * width + (o + j - o0)] =
                _mm512_reduce_add_ps(_mm512_add_ps(acc_r[0], acc_r[1]));
        }
    }
}

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
    let mut o = o0;
    // Four outputs at a time for one or two rows, two for three or four (the accumulators must fit in registers).
    if R <= 2 {
        while o + 4 <= o1 {
            tile::<4, R, L>(l, x, k, r0, o, o0, width, partial);
            o += 4;
        }
    } else {
        while o + 2 <= o1 {
            tile::<2, R, L>(l, x, k, r0, o, o0, width, partial);
            o += 2;
        }
    }
    while o < o1 {
        tile::<1, R, L>(l, x, k, r0, o, o0, width, partial);
        o += 1;
    }
}

#[inline(always)]
unsafe fn rows<L: Lanes16>(
    l: &L,
    x: &[f32],
    k: usize,
    rows: usize,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    let mut r = 0;
    while r < rows {
        let n = (rows - r).min(4);
        match n {
            4 => group::<4, L>(l, x, k, r, o0, o1, partial),
            3 => group::<3, L>(l, x, k, r, o0, o1, partial),
            2 => group::<2, L>(l, x, k, r, o0, o1, partial),
            _ => group::<1, L>(l, x, k, r, o0, o1, partial),
        }
        r += n;
    }
}

/// `partial[r][o − o0] = Σ_i x[r][i] · w[o][i]` with AVX-512.
///
/// # Safety
/// The CPU must support AVX-512F/BW, F16C and FMA; `x` holds `rows` rows of `w.padded_in` values.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub unsafe fn dot_avx512(
    w: &LinearWeight,
    x: &[f32],
    n: usize,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    let k = w.padded_in;
    assert!(x.len() >= n * k && partial.len() >= n * (o1 - o0));
    assert!(o1 <= w.out_features);
    match &w.storage {
        Storage::BF16(d) => rows(&Bf16(d, k), x, k, n, o0, o1, partial),
        Storage::F16(d) => rows(&F16(d, k), x, k, n, o0, o1, partial),
        Storage::Q8_0 { scales, quants } => rows(&Q8(scales, quants, k), x, k, n, o0, o1, partial),
        Storage::Q4_0 { scales, nibbles } => {
            rows(&Q4(scales, nibbles, k), x, k, n, o0, o1, partial)
        }
        Storage::F32(_) => unreachable!("f32 weights use GEMM"),
    }
}
