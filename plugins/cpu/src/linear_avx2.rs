//! Integer dot products of Q8_0/Q4_0 linear layers on x86 CPUs without AVX-512 (AVX2: most laptops and
//! desktops before AMD Zen 4, Intel's consumer chips): the activations quantised to int8 blocks ([`crate::int8`],
//! as on aarch64 and under VNNI), each 32-weight block's product summed exactly in `i32` by `vpmaddubsw` +
//! `vpmaddwd`, and the blocks scaled and summed in the order [`crate::int8::dot_reference`] fixes, so the result
//! is that definition's bit for bit (the aarch64 kernels' too).
//!
//! The float path it replaces (the portable kernel compiled for AVX2) widened every weight to f32 and
//! multiplied it in f32: on an AMD EPYC (Zen 5) with its AVX-512 linear kernels turned off, 0.6B q4_0 at 2
//! threads ran at RTF 1.85–2.26, slower than real time (0.68–0.70 on this kernel); q8_0 at 4.8–5.0 (0.95).
//!
//! `vpmaddubsw` multiplies unsigned bytes by signed ones: Q4_0's nibbles (0..15) are the unsigned side, and the
//! block's sum of activations times 8 is subtracted afterwards (`Σ (n − 8)·x = Σ n·x − 8·Σ x`); Q8_0's signed
//! weights go in as their magnitudes, their signs moved onto the activations (`vpsignb`). No pair of products
//! overflows its `i16` (15·127·2 and 127·127·2 are under 2¹⁵). Where the CPU has AVX-VNNI, one `vpdpbusd`
//! replaces the two (the same exact sums). The block scales are held as halves where all of a weight's are
//! (`linear::Scales`: 18 bytes a Q4_0 block instead of 20), widened four at a time by F16C. `KAZEIA_X86_LINEAR=avx2` takes this path on an AVX-512 CPU too (with
//! `KAZEIA_NO_VNNI=1`), `avx2-plain` without AVX-VNNI, to compare.

use std::arch::x86_64::*;

use crate::int8::QuantizedActs;
use crate::linear::{LinearWeight, Scales, Storage, BLOCK};

/// Whether Q8_0/Q4_0 layers take this kernel: a CPU with AVX2 and FMA whose AVX-512 kernels are not used.
pub(crate) fn usable() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let avx512 = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw");
        available() && (!avx512 || capped())
    })
}

/// Whether `KAZEIA_X86_LINEAR=avx2` (or `avx2-plain`) asks for the linear layers as an AVX2 CPU runs them: this
/// kernel, and the AVX2 float kernel instead of the AVX-512 one (with `KAZEIA_NO_VNNI=1`, nothing of AVX-512).
pub(crate) fn capped() -> bool {
    static CAPPED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CAPPED.get_or_init(|| std::env::var("KAZEIA_X86_LINEAR").is_ok_and(|v| v.starts_with("avx2")))
}

/// Whether this CPU can run the kernel.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// The activations for this kernel: int8 blocks and each block's sum (for Q4_0's −8 offset).
pub(crate) struct Acts {
    q: QuantizedActs,
    /// `[rows][k / 32]` for Q4_0; empty for Q8_0.
    sums: Vec<i32>,
}

/// Int8 activations for `w` when this kernel runs it (Q8_0 or Q4_0 on a CPU where it is [`usable`]).
pub(crate) fn quantize_for(w: &LinearWeight, x: &[f32], rows: usize) -> Option<Acts> {
    (usable() && matches!(w.storage, Storage::Q8_0 { .. } | Storage::Q4_0 { .. })).then(|| {
        acts(
            x,
            rows,
            w.padded_in,
            matches!(w.storage, Storage::Q4_0 { .. }),
        )
    })
}

/// `with_sums`: the blocks' sums too (Q4_0's offset needs them).
fn acts(x: &[f32], rows: usize, k: usize, with_sums: bool) -> Acts {
    let q = QuantizedActs::new(x, rows, k, false);
    let sums = if with_sums {
        q.quants
            .chunks_exact(BLOCK)
            .map(|b| b.iter().map(|&v| i32::from(v)).sum())
            .collect()
    } else {
        Vec::new()
    };
    Acts { q, sums }
}

/// The 32 weights of block `b` of output row `o`, as `vpmaddubsw` takes them (unsigned bytes), and what turns
/// the products of those bytes with the activations into the block's signed product.
trait Blocks {
    /// The block loaded once for every activation row.
    ///
    /// # Safety
    /// AVX2 enabled; `o`, `b` a row and block of the weight.
    unsafe fn load(&self, o: usize, b: usize) -> __m256i;
    /// The block `w` (from `load`) and the activations `x` as the unsigned and the signed operand whose
    /// products are the block's.
    ///
    /// # Safety
    /// AVX2 enabled.
    unsafe fn operands(w: __m256i, x: __m256i) -> (__m256i, __m256i);
    /// Whether the block's activation sum times 8 is to be subtracted (Q4_0).
    const OFFSET: bool;
}

/// Q8_0: `[out][k]` signed bytes.
struct Q8<'a>(&'a [i8], usize);
/// Q4_0: `[out][k / 2]` bytes, element `j < 16` of a block the low nibble of byte `j`, `j + 16` its high one.
struct Q4<'a>(&'a [u8], usize);

impl Blocks for Q8<'_> {
    const OFFSET: bool = false;
    #[inline(always)]
    unsafe fn load(&self, o: usize, b: usize) -> __m256i {
        // SAFETY: block `b` of row `o` is 32 bytes inside the `out × k` quants (the contract, and the slice's
        // length checked by the caller once per call); AVX2 is enabled.
        unsafe { _mm256_loadu_si256(self.0.as_ptr().add(o * self.1 + b * BLOCK).cast()) }
    }
    #[inline(always)]
    unsafe fn operands(w: __m256i, x: __m256i) -> (__m256i, __m256i) {
        // SAFETY: AVX2 is enabled (the contract); no memory is touched.
        unsafe { (_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)) }
    }
}

impl Blocks for Q4<'_> {
    const OFFSET: bool = true;
    #[inline(always)]
    unsafe fn load(&self, o: usize, b: usize) -> __m256i {
        // SAFETY: block `b` of row `o` is 16 bytes inside the `out × k/2` nibbles (the contract); AVX2 is
        // enabled.
        unsafe {
            let bytes = _mm_loadu_si128(self.0.as_ptr().add((o * self.1 + b * BLOCK) / 2).cast());
            let mask = _mm_set1_epi8(0x0f);
            let low = _mm_and_si128(bytes, mask);
            let high = _mm_and_si128(_mm_srli_epi16::<4>(bytes), mask);
            _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(low), high)
        }
    }
    #[inline(always)]
    unsafe fn operands(w: __m256i, x: __m256i) -> (__m256i, __m256i) {
        (w, x)
    }
}

/// A weight's block scales as the kernel reads them: `f32`, or halves widened by F16C.
trait BlockScales {
    /// Scales `at..at + n` (n ≤ 4) in lanes 0..n, zero beyond.
    ///
    /// # Safety
    /// AVX2 and F16C enabled.
    unsafe fn load4(&self, at: usize, n: usize) -> __m128;
}

impl BlockScales for [f32] {
    #[inline(always)]
    unsafe fn load4(&self, at: usize, n: usize) -> __m128 {
        // SAFETY: four readable values (`lanes` copies them through a bounds-checked slice).
        unsafe { _mm_loadu_ps(lanes(self, at, n).as_ptr()) }
    }
}

impl BlockScales for [u16] {
    #[inline(always)]
    unsafe fn load4(&self, at: usize, n: usize) -> __m128 {
        // SAFETY: four readable halves (`lanes` copies them through a bounds-checked slice); F16C is enabled
        // (the contract).
        unsafe { _mm_cvtph_ps(_mm_loadl_epi64(lanes(self, at, n).as_ptr().cast())) }
    }
}

/// `s[at..at + n]` (n ≤ 4) in lanes 0..n, zero beyond: one load when `n` is 4.
///
/// # Safety
/// SSE2 (the x86-64 baseline).
#[inline(always)]
unsafe fn lanes<T: Copy + Default>(s: &[T], at: usize, n: usize) -> [T; 4] {
    if n == 4 {
        s[at..at + 4].try_into().unwrap()
    } else {
        let mut t = [T::default(); 4];
        t[..n].copy_from_slice(&s[at..at + n]);
        t
    }
}

/// `partial[r][o − o0] = Σ_b (w·x)_b · d_w · d_x` for Q8_0/Q4_0 `w`: [`crate::int8::dot_reference`] bit for
/// bit. The CPU must have AVX2 and FMA ([`available`]).
pub(crate) fn dot_int8(w: &LinearWeight, x: &Acts, o0: usize, o1: usize, partial: &mut [f32]) {
    dot_int8_with(avx_vnni(), w, x, o0, o1, partial)
}

/// [`dot_int8`] with or without AVX-VNNI (which the CPU must then have).
fn dot_int8_with(
    vnni: bool,
    w: &LinearWeight,
    x: &Acts,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    assert!(available(), "the AVX2 integer kernel on a CPU without AVX2");
    assert!(
        !vnni || std::arch::is_x86_feature_detected!("avxvnni"),
        "AVX-VNNI on a CPU without it"
    );
    let (k, rows) = (w.padded_in, x.q.rows);
    assert!(x.q.k == k && o1 <= w.out_features && partial.len() >= rows * (o1 - o0));
    let scales = match &w.storage {
        Storage::Q8_0 { scales, .. } | Storage::Q4_0 { scales, .. } => scales,
        _ => unreachable!("integer dot products are for Q8_0/Q4_0 weights"),
    };
    macro_rules! run {
        ($w:expr) => {
            match (scales, vnni) {
                (Scales::F32(s), true) => rows_avx_vnni(&$w, s.as_slice(), x, o0, o1, partial),
                (Scales::F32(s), false) => rows_avx2(&$w, s.as_slice(), x, o0, o1, partial),
                (Scales::Half(s), true) => rows_avx_vnni(&$w, s.as_slice(), x, o0, o1, partial),
                (Scales::Half(s), false) => rows_avx2(&$w, s.as_slice(), x, o0, o1, partial),
            }
        };
    }
    // SAFETY: the features were checked above; the weights hold `out × k` values (their storage's invariant),
    // `x` holds `rows × k` (checked above).
    unsafe {
        match &w.storage {
            Storage::Q8_0 { quants, .. } => {
                assert!(quants.len() >= w.out_features * k);
                run!(Q8(quants, k))
            }
            Storage::Q4_0 { nibbles, .. } => {
                assert!(nibbles.len() >= w.out_features * k / 2);
                assert_eq!(
                    x.sums.len(),
                    rows * (k / BLOCK),
                    "Q4_0 needs the blocks' sums"
                );
                run!(Q4(nibbles, k))
            }
            _ => unreachable!("integer dot products are for Q8_0/Q4_0 weights"),
        }
    }
}

/// Whether the CPU has AVX-VNNI (Intel since Alder Lake, AMD since Zen 5): one `vpdpbusd` for a block's
/// products instead of `vpmaddubsw` + `vpmaddwd` (the same exact sums). `KAZEIA_X86_LINEAR=avx2-plain` keeps
/// the plain AVX2 instructions, to compare.
fn avx_vnni() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avxvnni")
            && std::env::var("KAZEIA_X86_LINEAR").map_or(true, |v| v != "avx2-plain")
    })
}

/// [`rows`] with AVX-VNNI.
///
/// # Safety
/// AVX2, FMA and AVX-VNNI; as [`rows`].
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn rows_avx_vnni<W: Blocks, S: BlockScales + ?Sized>(
    w: &W,
    ws: &S,
    x: &Acts,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    // SAFETY: the contract.
    unsafe { rows::<W, S, true>(w, ws, x, o0, o1, partial) }
}

/// [`rows`] with AVX2 alone.
///
/// # Safety
/// AVX2 and FMA; as [`rows`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_avx2<W: Blocks, S: BlockScales + ?Sized>(
    w: &W,
    ws: &S,
    x: &Acts,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    // SAFETY: the contract.
    unsafe { rows::<W, S, false>(w, ws, x, o0, o1, partial) }
}

/// # Safety
/// AVX2 and FMA (and AVX-VNNI with `VNNI`) enabled in the caller; `w` of `x.q.k` columns holding the output
/// rows `o0..o1`, `ws` its block scales.
#[inline(always)]
unsafe fn rows<W: Blocks, S: BlockScales + ?Sized, const VNNI: bool>(
    w: &W,
    ws: &S,
    x: &Acts,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    let width = o1 - o0;
    let mut r = 0;
    // Up to four activation rows per pass over a weight row: each weight block is unpacked once for them.
    while r < x.q.rows {
        let n = (x.q.rows - r).min(4);
        for o in o0..o1 {
            let mut out = [0.0f32; 4];
            // SAFETY: the features are enabled here; rows `r..r + n` exist; `o` is a row of `w`.
            unsafe {
                match n {
                    4 => row::<4, W, S, VNNI>(w, ws, x, r, o, &mut out),
                    3 => row::<3, W, S, VNNI>(w, ws, x, r, o, &mut out),
                    2 => row::<2, W, S, VNNI>(w, ws, x, r, o, &mut out),
                    _ => row::<1, W, S, VNNI>(w, ws, x, r, o, &mut out),
                }
            }
            for (i, v) in out.iter().take(n).enumerate() {
                partial[(r + i) * width + (o - o0)] = *v;
            }
        }
        r += n;
    }
}

/// Output row `o` against activation rows `r0..r0+R` into `out[..R]`: four partial sums per row, block `b`
/// into lane `b mod 4`, ending as `(s0 + s1) + (s2 + s3)`.
///
/// # Safety
/// AVX2 and FMA (and AVX-VNNI with `VNNI`) enabled; rows `r0..r0 + R` of `x`, row `o` of `w`, and its `k / 32`
/// scales in `ws` exist.
#[inline(always)]
unsafe fn row<const R: usize, W: Blocks, S: BlockScales + ?Sized, const VNNI: bool>(
    w: &W,
    ws: &S,
    x: &Acts,
    r0: usize,
    o: usize,
    out: &mut [f32; 4],
) {
    let nb = x.q.k / BLOCK;
    // SAFETY: AVX2 is enabled (the contract); no memory is touched.
    let mut acc = unsafe { [_mm_setzero_ps(); R] };
    // Whole groups of four blocks with every count a constant (so the accumulators stay in registers), then
    // the last one to three.
    let whole = nb - nb % 4;
    // SAFETY: the groups' blocks lie in row `o` and rows `r0..r0 + R` (the contract); the features are the
    // caller's.
    unsafe {
        for b0 in (0..whole).step_by(4) {
            group::<R, 4, W, S, VNNI>(w, ws, x, r0, o, b0, &mut acc);
        }
        match nb - whole {
            3 => group::<R, 3, W, S, VNNI>(w, ws, x, r0, o, whole, &mut acc),
            2 => group::<R, 2, W, S, VNNI>(w, ws, x, r0, o, whole, &mut acc),
            1 => group::<R, 1, W, S, VNNI>(w, ws, x, r0, o, whole, &mut acc),
            _ => {}
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        let mut s = [0.0f32; 4];
        // SAFETY: four writable values; SSE is part of the x86-64 baseline.
        unsafe { _mm_storeu_ps(s.as_mut_ptr(), *a) };
        *o = (s[0] + s[1]) + (s[2] + s[3]);
    }
}

/// Blocks `b0..b0 + N` (N ≤ 4) of output row `o` into the sums of rows `r0..r0 + R`: lane `j` ← block `b0 + j`;
/// lanes from `N` on add zero times a zero scale (+0, which leaves a sum as it is).
///
/// # Safety
/// As [`row`], for these blocks.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn group<
    const R: usize,
    const N: usize,
    W: Blocks,
    S: BlockScales + ?Sized,
    const VNNI: bool,
>(
    w: &W,
    ws: &S,
    x: &Acts,
    r0: usize,
    o: usize,
    b0: usize,
    acc: &mut [__m128; R],
) {
    let (k, nb) = (x.q.k, x.q.k / BLOCK);
    // SAFETY: the blocks b0..b0 + N of row `o` and of rows `r0..r0 + R` exist (the contract); the features are
    // enabled.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let zero = _mm256_setzero_si256();
        let wsc = ws.load4(o * nb + b0, N);
        let mut wv = [zero; 4];
        for (j, v) in wv.iter_mut().enumerate().take(N) {
            *v = w.load(o, b0 + j);
        }
        for (ri, a) in acc.iter_mut().enumerate() {
            let row = r0 + ri;
            let mut dots = [zero; 4];
            for (j, d) in dots.iter_mut().enumerate().take(N) {
                let xv =
                    _mm256_loadu_si256(x.q.quants.as_ptr().add(row * k + (b0 + j) * BLOCK).cast());
                let (u, s) = W::operands(wv[j], xv);
                *d = if VNNI {
                    _mm256_dpbusd_avx_epi32(zero, u, s)
                } else {
                    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones)
                };
            }
            // Eight i32 per block → one per block, lane j = block b0 + j (integer sums: exact).
            let h = _mm256_hadd_epi32(
                _mm256_hadd_epi32(dots[0], dots[1]),
                _mm256_hadd_epi32(dots[2], dots[3]),
            );
            let mut sums =
                _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
            let xsc = _mm_loadu_ps(lanes(&x.q.scales, row * nb + b0, N).as_ptr());
            if W::OFFSET {
                let offsets = lanes(&x.sums, row * nb + b0, N);
                let offsets = _mm_slli_epi32::<3>(_mm_loadu_si128(offsets.as_ptr().cast()));
                sums = _mm_sub_epi32(sums, offsets);
            }
            *a = _mm_fmadd_ps(_mm_cvtepi32_ps(sums), _mm_mul_ps(wsc, xsc), *a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::int8::{
        check_layers_give_the_reference_plus_bias, dot_reference, test_values as values,
    };
    use kazeia_backend_abi::WeightFormat;

    /// Without AVX-VNNI, and with it where the CPU has it.
    fn variants() -> Vec<bool> {
        let vnni = std::arch::is_x86_feature_detected!("avxvnni");
        [false, true].into_iter().filter(|&v| !v || vnni).collect()
    }

    #[test]
    fn the_avx2_integer_kernel_equals_the_scalar_reference_bit_for_bit() {
        if !available() {
            eprintln!("skipped: no AVX2 here");
            return;
        }
        // Rows past a multiple of four, block counts past a multiple of four, one block, odd output ranges.
        for format in [WeightFormat::Q8_0, WeightFormat::Q4_0] {
            for (out, inp) in [(5, 32), (9, 96), (33, 160), (70, 1024), (3, 3072)] {
                let w = values(out * inp, 1 + out as u32);
                let plain = LinearWeight::new_plain(&w, out, inp, None, format);
                let k = plain.padded_in;
                let halves = LinearWeight::new_plain(&w, out, inp, None, format).with_half_scales();
                assert_eq!(crate::linear::half_scales(&halves), Some(true));
                for rows in [1, 2, 3, 4, 5, 8] {
                    let q4 = format == WeightFormat::Q4_0;
                    let x = acts(&values(rows * k, 7 + rows as u32), rows, k, q4);
                    for (o0, o1) in [(0, out), (out / 3, out - out / 4)] {
                        if o0 >= o1 {
                            continue;
                        }
                        let mut want = vec![0.0f32; rows * (o1 - o0)];
                        dot_reference(&plain, &x.q, o0, o1, &mut want);
                        for (vnni, lw) in variants()
                            .into_iter()
                            .flat_map(|v| [(v, &plain), (v, &halves)])
                        {
                            let mut got = vec![f32::NAN; rows * (o1 - o0)];
                            dot_int8_with(vnni, lw, &x, o0, o1, &mut got);
                            let bits =
                                |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                            assert_eq!(
                                bits(&got),
                                bits(&want),
                                "{format} out {out} in {inp} rows {rows} outputs {o0}..{o1} \
                                 AVX-VNNI {vnni}, half scales {}",
                                std::ptr::eq(lw, &halves)
                            );
                        }
                    }
                }
            }
        }
    }

    /// A layer on this path gives the reference plus its bias, for the rows the decode path takes.
    #[test]
    fn a_layer_on_the_avx2_integer_path_gives_the_reference_plus_bias() {
        if !usable() || crate::linear_vnni::usable() {
            eprintln!(
                "skipped: the AVX2 integer kernel is not in use here \
                 (KAZEIA_NO_VNNI=1 KAZEIA_X86_LINEAR=avx2 takes it)"
            );
            return;
        }
        check_layers_give_the_reference_plus_bias(&[1, 2, 5, 8]);
    }
}
