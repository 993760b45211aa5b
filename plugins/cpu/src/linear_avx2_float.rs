//! The decode-and-dot path of F32 / F16 / BF16 linear layers on x86 CPUs without AVX-512 (AVX2 + FMA + F16C):
//! the twin of `linear_x86.rs`'s AVX-512 kernel with 8 lanes. Each 16 weights are widened to f32 in registers
//! (BF16 by a shift and a mask of one 32-byte load, its even and odd weights against activations reordered the
//! same way once a call; F16 by `vcvtph2ps`) and multiplied into up to four rows of f32 activations, two
//! accumulators a row.
//!
//! The portable kernel compiled for AVX2 that it replaces ran the released 0.6B model as stored (bf16) at
//! RTF 4.6 on 2 threads of an AMD EPYC (Zen 5) with its AVX-512 kernels turned off (talker 83 ms a frame), the
//! AVX-512 kernel at 1.09 on the same machine.

use std::arch::x86_64::*;

use crate::aligned::Aligned;
use crate::linear::{reordered_once, LinearWeight, Reordered, Storage};

/// Sixteen consecutive weights from element `i` of output row `o`, widened to f32 in two vectors.
trait Lanes {
    /// # Safety
    /// AVX2 and F16C enabled; `o` an output row of the weight, `i + 16 ≤` its padded row length.
    unsafe fn load16(&self, o: usize, i: usize) -> (__m256, __m256);
    /// Whether [`Lanes::load16`] gives the 16 weights as the even-numbered ones and the odd ones (the
    /// activations are then laid out the same way, [`even_odd`]) instead of the first eight and the last eight.
    const EVEN_ODD: bool = false;
    /// Where weight `i` of row `o` is stored (for prefetching: computed, never read here).
    fn addr(&self, o: usize, i: usize) -> *const i8;
}

/// `[out][k]` weights, `k` the padded row length.
struct F32<'a>(&'a [f32], usize);
struct Bf16<'a>(&'a [u16], usize);
struct F16<'a>(&'a [u16], usize);

impl Lanes for F32<'_> {
    #[inline(always)]
    unsafe fn load16(&self, o: usize, i: usize) -> (__m256, __m256) {
        // SAFETY: the 16 weights lie in row `o` (the contract); AVX is enabled.
        unsafe {
            let p = self.0.as_ptr().add(o * self.1 + i);
            (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
        }
    }
    fn addr(&self, o: usize, i: usize) -> *const i8 {
        self.0.as_ptr().wrapping_add(o * self.1 + i).cast()
    }
}

impl Lanes for Bf16<'_> {
    /// One load and two ops for 16 weights: a bf16 is the top half of its f32, so the even weights (the low halves
    /// of the 32-bit lanes) are shifted up and the odd ones (the high halves) masked in place.
    #[inline(always)]
    unsafe fn load16(&self, o: usize, i: usize) -> (__m256, __m256) {
        // SAFETY: the 16 weights lie in row `o` (the contract); AVX2 is enabled.
        unsafe {
            let v = _mm256_loadu_si256(self.0.as_ptr().add(o * self.1 + i).cast());
            let even = _mm256_slli_epi32::<16>(v);
            let odd = _mm256_and_si256(v, _mm256_set1_epi32(0xffff_0000u32 as i32));
            (_mm256_castsi256_ps(even), _mm256_castsi256_ps(odd))
        }
    }
    const EVEN_ODD: bool = true;
    fn addr(&self, o: usize, i: usize) -> *const i8 {
        self.0.as_ptr().wrapping_add(o * self.1 + i).cast()
    }
}

impl Lanes for F16<'_> {
    #[inline(always)]
    unsafe fn load16(&self, o: usize, i: usize) -> (__m256, __m256) {
        // SAFETY: the 16 weights lie in row `o` (the contract); F16C is enabled.
        unsafe {
            let p = self.0.as_ptr().add(o * self.1 + i);
            (
                _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(8).cast())),
            )
        }
    }
    fn addr(&self, o: usize, i: usize) -> *const i8 {
        self.0.as_ptr().wrapping_add(o * self.1 + i).cast()
    }
}

/// How far ahead of the weight stream [`dot_row`] prefetches (as the AVX-512 kernel).
const PREFETCH_BYTES: usize = 4096;

/// Rows `r0..r0+R` against output row `o`.
///
/// # Safety
/// AVX2, FMA and F16C enabled; row `o` of `l`, and rows `r0..r0+R` of `x`, hold `k` values (a multiple of 16).
#[inline(always)]
unsafe fn dot_row<const R: usize, L: Lanes>(
    l: &L,
    x: &[f32],
    k: usize,
    r0: usize,
    o: usize,
) -> [f32; R] {
    // SAFETY: `i + 16 ≤ k`, so the weight loads stay in row `o` and the activation loads in row `r0 + r`, which
    // `x` holds (the contract); the features are enabled.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for i in (0..k).step_by(16) {
            // A prefetch reads nothing the program sees, wherever it points (past the row: the next one's).
            _mm_prefetch::<_MM_HINT_T0>(l.addr(o, i).wrapping_add(PREFETCH_BYTES));
            let (w0, w1) = l.load16(o, i);
            for (r, a) in acc.iter_mut().enumerate() {
                let xp = x.as_ptr().add((r0 + r) * k + i);
                a[0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xp), a[0]);
                a[1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xp.add(8)), a[1]);
            }
        }
        let mut out = [0.0; R];
        for (o, a) in out.iter_mut().zip(&acc) {
            let v = _mm256_add_ps(a[0], a[1]);
            let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
            *o = _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
        }
        out
    }
}

/// # Safety
/// As [`dot_row`] for every output row `o0..o1` and the `rows` rows of `x`.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // the call's operands and its task's output rows
unsafe fn rows<L: Lanes>(
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
        // SAFETY: AVX2 is enabled in the caller (as `dot_row` requires), and so on this CPU.
        reordered_once(reordered, &mut own, || unsafe { even_odd(&x[..rows * k]) })
    } else {
        x
    };
    let width = o1 - o0;
    let mut r = 0;
    // Four rows at most: two accumulators each and the two weight vectors fill the 16 registers.
    while r < rows {
        let n = (rows - r).min(4);
        for o in o0..o1 {
            // SAFETY: rows `r..r + n` and output row `o` are in range (the contract).
            let sums: [f32; 4] = unsafe {
                match n {
                    4 => dot_row::<4, L>(l, x, k, r, o),
                    3 => pad(dot_row::<3, L>(l, x, k, r, o)),
                    2 => pad(dot_row::<2, L>(l, x, k, r, o)),
                    _ => pad(dot_row::<1, L>(l, x, k, r, o)),
                }
            };
            for (i, v) in sums.iter().take(n).enumerate() {
                partial[(r + i) * width + (o - o0)] = *v;
            }
        }
        r += n;
    }
}

/// `x` with each 16 values reordered as their 8 even-numbered values, then their 8 odd ones: the order in which
/// [`Lanes::load16`] gives the weights of an [`Lanes::EVEN_ODD`] layout. Four ops for 16 values, once per linear
/// call (its tasks share the result through [`Reordered`]).
#[target_feature(enable = "avx2")]
fn even_odd(x: &[f32]) -> Aligned<f32> {
    let mut out = Aligned::zeroed(x.len());
    for (dst, src) in out.chunks_exact_mut(16).zip(x.chunks_exact(16)) {
        // SAFETY: `src` holds 16 values (`chunks_exact`).
        let (a, b) = unsafe {
            (
                _mm256_loadu_ps(src.as_ptr()),
                _mm256_loadu_ps(src.as_ptr().add(8)),
            )
        };
        // Within each 128-bit half: a0 a2 b0 b2 | a4 a6 b4 b6 (and the odd ones alike); then the 64-bit pairs
        // in order (a0 a2, a4 a6, b0 b2, b4 b6).
        let in_order = |v: __m256| {
            _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(v)))
        };
        let even = in_order(_mm256_shuffle_ps::<0b10_00_10_00>(a, b));
        let odd = in_order(_mm256_shuffle_ps::<0b11_01_11_01>(a, b));
        // SAFETY: `dst` holds 16 values, from a line boundary (`Aligned`, chunks of 64 bytes).
        unsafe {
            _mm256_store_ps(dst.as_mut_ptr(), even);
            _mm256_store_ps(dst.as_mut_ptr().add(8), odd);
        }
    }
    out
}

fn pad<const N: usize>(v: [f32; N]) -> [f32; 4] {
    let mut out = [0.0; 4];
    out[..N].copy_from_slice(&v);
    out
}

/// Whether [`dot`] runs `w`: F32, F16 or BF16 storage.
pub(crate) fn runs(w: &LinearWeight) -> bool {
    matches!(
        w.storage,
        Storage::F32(_) | Storage::F16(_) | Storage::BF16(_)
    )
}

/// `partial[r][o − o0] = Σ_i x[r][i] · w[o][i]` for an F32, F16 or BF16 `w` ([`runs`]).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `x` holds `n` rows of `w.padded_in` values; `reordered` is shared
/// only by calls on the same `x` and rows (one linear call's tasks).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot(
    w: &LinearWeight,
    x: &[f32],
    reordered: &Reordered,
    n: usize,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    let k = w.padded_in;
    assert!(k.is_multiple_of(16), "rows padded to whole blocks");
    assert!(x.len() >= n * k && partial.len() >= n * (o1 - o0) && o1 <= w.out_features);
    // SAFETY: the features are enabled here (the contract); the asserts above and the storage's
    // `out_features × padded_in` layout keep every row and element index in range.
    unsafe {
        match &w.storage {
            Storage::F32(d) => rows(&F32(d, k), x, reordered, k, n, o0, o1, partial),
            Storage::BF16(d) => rows(&Bf16(d, k), x, reordered, k, n, o0, o1, partial),
            Storage::F16(d) => rows(&F16(d, k), x, reordered, k, n, o0, o1, partial),
            _ => unreachable!("the AVX2 float kernel runs F32, F16 and BF16 weights"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::int8::test_values;
    use kazeia_backend_abi::WeightFormat;

    /// Each output within the bound of an `n`-term f32 sum in any order (`γ(n) · Σ|term|`, u = 2⁻²⁴) of the exact
    /// sum of the weights as stored times the activations, for 1–9 rows and output sub-ranges.
    #[test]
    fn the_avx2_float_kernel_is_the_exact_sum_within_f32_rounding() {
        let features = ["avx2", "fma", "f16c"];
        if !std::arch::is_x86_feature_detected!("avx2")
            || !std::arch::is_x86_feature_detected!("fma")
            || !std::arch::is_x86_feature_detected!("f16c")
        {
            eprintln!("skipped: no {features:?} here");
            return;
        }
        for format in [WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16] {
            for (out, inp) in [(5, 32), (9, 70), (33, 1024)] {
                let w = test_values(out * inp, 1 + out as u32);
                let lw = LinearWeight::new_plain(&w, out, inp, None, format);
                let k = lw.padded_in;
                // The weights as stored, widened (exactly) back.
                let stored: Vec<f32> = (0..out)
                    .flat_map(|o| {
                        let mut row = vec![0.0; k];
                        crate::linear::decode_row(&lw, o, &mut row);
                        row
                    })
                    .collect();
                for rows in [1, 2, 3, 4, 5, 9] {
                    let x = test_values(rows * k, 7 + rows as u32);
                    for (o0, o1) in [(0, out), (out / 3, out - out / 4)] {
                        if o0 >= o1 {
                            continue;
                        }
                        let width = o1 - o0;
                        let mut got = vec![f32::NAN; rows * width];
                        // SAFETY: the features were checked above; `x` holds `rows` rows of `k` values.
                        unsafe { dot(&lw, &x, &Reordered::new(), rows, o0, o1, &mut got) };
                        for r in 0..rows {
                            for o in o0..o1 {
                                let terms = (0..k).map(|i| {
                                    f64::from(stored[o * k + i]) * f64::from(x[r * k + i])
                                });
                                let exact: f64 = terms.clone().sum();
                                let size: f64 = terms.map(f64::abs).sum();
                                let nu = k as f64 * f64::from(f32::EPSILON) / 2.0;
                                let bound = nu / (1.0 - nu) * size;
                                let v = f64::from(got[r * width + o - o0]);
                                assert!(
                                    (v - exact).abs() <= bound,
                                    "{format} out {out} in {inp} rows {rows}: row {r} output {o} is {v}, \
                                     exact {exact} (bound {bound:e})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
