//! Q8_0 and Q4_0 linear layers on x86 CPUs without AVX512-VNNI (AVX2: most laptops and desktops before AMD
//! Zen 4, Intel's consumer chips; and AVX-512 CPUs without VNNI), on the weights and activations as the
//! AVX512-VNNI kernel lays them out ([`crate::linear_vnni`]): each 64-byte vector read as two 256-bit halves,
//! lanes 0–7 and 8–15, one 32-bit lane per 32-weight block. A group's blocks are summed exactly in `i32` lane by lane, then converted and scaled
//! once per group — no horizontal sums per block, as a kernel on the plain layout needs — and the 16 lanes end
//! in the same tree: the result is the VNNI kernel's bit for bit (the tests compare both with one scalar
//! definition).
//!
//! The integer products: one AVX-VNNI `vpdpbusd` where the CPU has it (Intel since Alder Lake, AMD since Zen 5),
//! exactly as the 512-bit kernel does (Q4_0: nibbles `w + 8` times the activations, each sum started at
//! `−8 · Σx`; Q8_0: activations offset to `x + 128` times the weights, started at `−128 · Σw`). Plain AVX2
//! multiplies with `vpmaddubsw` + `vpmaddwd`, whose pairs of products must fit an `i16`: Q4_0's (`2 · 15 · 127`)
//! do; Q8_0 takes the activations back to signed bytes and moves the weights' signs onto them (`|w| · ±x`,
//! `2 · 127 · 127`), its sums started at zero.
//!
//! It replaces a kernel on the plain layout (three horizontal adds and a convert per four blocks and row, ~1.3
//! cycles a block and row): on an AMD EPYC (Zen 5) with its AVX-512 kernels turned off, 0.6B q4_0 at 2 threads,
//! prefill 78–80 → 45–51 ms, code predictor 23–24 → 16–17 ms/frame, RTF 0.75 → 0.62 (plain AVX2: 0.82 →
//! 0.64). `KAZEIA_X86_LINEAR=avx2` takes this path on an AVX-512 CPU too (with `KAZEIA_NO_VNNI=1`),
//! `avx2-plain` without AVX-VNNI, to compare.

use std::arch::x86_64::*;

use crate::linear_vnni::{
    Kind, Packed, PackedActs, Scales, GROUP, LANES_BYTES, OUTPUT_BLOCK, PREFETCH_BYTES,
};

/// Whether Q8_0/Q4_0 layers take this kernel: a CPU with AVX2, FMA and F16C that does not run the AVX512-VNNI
/// kernel — AVX2 CPUs, and AVX-512 ones without VNNI (Skylake-SP/X), where it beats the AVX-512 float kernel
/// that widens every weight: on this Zen 5 with `KAZEIA_NO_VNNI=1`, 0.6B q4_0 at 2 threads, talker 10.2/10.1 →
/// 6.1/6.9 ms/frame, code predictor 26.9/28.5 → 15.6/15.1, first audio 125/137 → 82/77 ms, RTF 0.66/0.69 →
/// 0.47/0.47 (plain AVX2, as those CPUs have no AVX-VNNI).
pub(crate) fn usable() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| available() && !crate::linear_vnni::usable())
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

/// Whether the CPU has AVX-VNNI (Intel since Alder Lake, AMD since Zen 5): one `vpdpbusd` for a block's
/// products instead of `vpmaddubsw` + `vpmaddwd` (the same exact sums). `KAZEIA_X86_LINEAR=avx2-plain` keeps
/// the plain AVX2 instructions, to compare.
pub(crate) fn avx_vnni() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avxvnni")
            && std::env::var("KAZEIA_X86_LINEAR").map_or(true, |v| v != "avx2-plain")
    })
}

/// `store(o, r, y[r][o])` for the activation rows of `x` and the output rows `o0..o1` of `w`, once each, with
/// AVX-VNNI where the CPU has it ([`avx_vnni`]).
pub(crate) fn dot_into(
    w: &Packed,
    x: &PackedActs,
    o0: usize,
    o1: usize,
    store: impl FnMut(usize, usize, f32),
) {
    dot_into_with(avx_vnni(), w, x, o0, o1, store)
}

/// [`dot_into`] with or without AVX-VNNI (which the CPU must then have).
pub(crate) fn dot_into_with(
    vnni: bool,
    w: &Packed,
    x: &PackedActs,
    o0: usize,
    o1: usize,
    mut store: impl FnMut(usize, usize, f32),
) {
    assert!(available(), "the AVX2 integer kernel on a CPU without AVX2");
    assert!(
        !vnni || std::arch::is_x86_feature_detected!("avxvnni"),
        "AVX-VNNI on a CPU without it"
    );
    assert_eq!(
        w.groups, x.groups,
        "activations quantised for another weight"
    );
    assert!(o0 <= o1 && o1 <= w.out);
    assert_eq!(x.corrections.is_empty(), w.kind == Kind::Q8_0);
    assert_eq!(
        w.corrections.is_empty(),
        w.kind == Kind::Q4_0 || !vnni,
        "Q8_0's corrections go with AVX-VNNI"
    );
    let half = matches!(w.scales, Scales::Half(_));
    // SAFETY: the features were checked above; `w` and `x` agree (asserted) and `o0 ≤ o1 ≤ out`.
    unsafe {
        match (vnni, half) {
            (true, true) => tiles_avx_vnni::<true>(w, x, o0, o1, &mut store),
            (true, false) => tiles_avx_vnni::<false>(w, x, o0, o1, &mut store),
            (false, true) => tiles_avx2::<true>(w, x, o0, o1, &mut store),
            (false, false) => tiles_avx2::<false>(w, x, o0, o1, &mut store),
        }
    }
}

/// [`tiles`] with AVX-VNNI.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-VNNI; as [`tiles`].
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn tiles_avx_vnni<const HALF: bool>(
    w: &Packed,
    x: &PackedActs,
    o0: usize,
    o1: usize,
    store: &mut impl FnMut(usize, usize, f32),
) {
    // SAFETY: the contract.
    unsafe { tiles::<HALF, true>(w, x, o0, o1, store) }
}

/// [`tiles`] with AVX2 alone.
///
/// # Safety
/// AVX2, FMA and F16C; as [`tiles`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiles_avx2<const HALF: bool>(
    w: &Packed,
    x: &PackedActs,
    o0: usize,
    o1: usize,
    store: &mut impl FnMut(usize, usize, f32),
) {
    // SAFETY: the contract.
    unsafe { tiles::<HALF, false>(w, x, o0, o1, store) }
}

/// Output rows in blocks of [`OUTPUT_BLOCK`] (their weights stay in cache while the activation rows pass), two
/// activation rows per pass over one output row, or one activation row against a stored pair of output rows
/// (the decode step: the pair is one sequential stream). Sixteen 256-bit registers hold no more.
///
/// # Safety
/// AVX2, FMA and F16C (and AVX-VNNI with `VNNI`) enabled; `w` and `x` as [`dot_into_with`] asserts,
/// `o0 ≤ o1 ≤ w.out`, and `HALF` what `w` stores.
#[inline(always)]
unsafe fn tiles<const HALF: bool, const VNNI: bool>(
    w: &Packed,
    x: &PackedActs,
    o0: usize,
    o1: usize,
    store: &mut impl FnMut(usize, usize, f32),
) {
    for ob in (o0..o1).step_by(OUTPUT_BLOCK) {
        let ob_end = (ob + OUTPUT_BLOCK).min(o1);
        for r0 in (0..x.rows).step_by(2) {
            let rows = (x.rows - r0).min(2);
            let mut o = ob;
            while o < ob_end {
                let outs = if rows == 1 && o % 2 == 0 {
                    (ob_end - o).min(2)
                } else {
                    1
                };
                // SAFETY: the features are enabled here; `o + outs ≤ out`, `r0 + rows ≤ x.rows` (the loop
                // bounds), which is what `tile` reads.
                unsafe {
                    match (outs, rows) {
                        (2, _) => tile::<2, 1, HALF, VNNI>(w, x, o, r0, store),
                        (_, 2) => tile::<1, 2, HALF, VNNI>(w, x, o, r0, store),
                        _ => tile::<1, 1, HALF, VNNI>(w, x, o, r0, store),
                    }
                }
                o += outs;
            }
        }
    }
}

/// Output rows `o..o+O` × activation rows `r0..r0+R`: per group, the low 256-bit halves (lanes 0–7) and then
/// the high ones (lanes 8–15), each lane a block's exact sum, converted and scaled into its lane of the row's
/// two f32 accumulators.
///
/// # Safety
/// As [`tiles`]; `o + O ≤ w.out`, `r0 + R ≤ x.rows`, `o` even when `O` is 2 (one stored pair).
#[inline(always)]
unsafe fn tile<const O: usize, const R: usize, const HALF: bool, const VNNI: bool>(
    w: &Packed,
    x: &PackedActs,
    o: usize,
    r0: usize,
    store: &mut impl FnMut(usize, usize, f32),
) {
    const HALF_BYTES: usize = LANES_BYTES / 2;
    // SAFETY: the features are enabled wherever this inlines (the contract); every load stays in the buffers
    // (see the offsets below).
    unsafe {
        let groups = w.groups;
        let vectors = w.kind.vectors();
        // The offsets below stay inside the pair of row `o` and the rows `r0..r0+R` of `groups` groups, which the
        // buffers hold (`Packed` stores whole pairs).
        let pair = w.pair_streams(o);
        let (w_data, w_corr) = (pair.data, pair.corrections);
        let (w_vector, w_group, w_lanes_group) =
            (pair.vector_stride, pair.group_bytes, pair.lanes_group);
        let (x_vector, x_group) = (LANES_BYTES, 8 * LANES_BYTES);
        let scale_bytes = pair.scale_bytes::<HALF>();
        let x_rows = |ri: usize| (r0 + ri) * groups;
        let x_data = x.quants.as_ptr();
        let nibble_mask = _mm256_set1_epi8(0x0f);
        let sign_bits = _mm256_set1_epi8(-128);
        let ones = _mm256_set1_epi16(1);
        let scales_ahead = pair.scales_ahead::<HALF>();
        let w_scale_lanes = |g: usize| pair.scale_lanes::<HALF>(g);
        // `acc + Σ u·s` over each lane's four byte pairs, exactly.
        let dot = |acc: __m256i, u: __m256i, s: __m256i| {
            if VNNI {
                _mm256_dpbusd_avx_epi32(acc, u, s)
            } else {
                _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones))
            }
        };
        let mut acc = [[[_mm256_setzero_ps(); 2]; R]; O];
        for g in 0..groups {
            prefetch(w_scale_lanes(g), scales_ahead, if HALF { 1 } else { 2 });
            for p in 0..vectors {
                prefetch(
                    w_data.wrapping_add(g * w_group + p * w_vector),
                    PREFETCH_BYTES,
                    2,
                );
            }
            for h in 0..2 {
                let lane0 = h * GROUP / 2;
                // SAFETY: half `h` of one 64-byte vector of group `g` (see above).
                let act = |ri: usize, j: usize| {
                    _mm256_loadu_si256(
                        x_data
                            .add((x_rows(ri) + g) * x_group + j * x_vector + h * HALF_BYTES)
                            .cast(),
                    )
                };
                // SAFETY: as `act`.
                let weights = |oi: usize, v: usize| {
                    _mm256_loadu_si256(
                        w_data
                            .add(g * w_group + v * w_vector + oi * LANES_BYTES + h * HALF_BYTES)
                            .cast(),
                    )
                };
                // Each lane's exact sum starts at its block's correction (none for Q8_0 without VNNI).
                let mut sums = [[_mm256_setzero_si256(); R]; O];
                for (oi, row) in sums.iter_mut().enumerate() {
                    for (ri, s) in row.iter_mut().enumerate() {
                        // SAFETY: eight i32 lanes of group `g` (see above).
                        *s = {
                            match w.kind {
                                Kind::Q4_0 => _mm256_loadu_si256(
                                    x.corrections
                                        .as_ptr()
                                        .add((x_rows(ri) + g) * GROUP + lane0)
                                        .cast(),
                                ),
                                Kind::Q8_0 if VNNI => _mm256_loadu_si256(
                                    w_corr.add(g * w_lanes_group + oi * GROUP + lane0).cast(),
                                ),
                                Kind::Q8_0 => _mm256_setzero_si256(),
                            }
                        };
                    }
                }
                match w.kind {
                    Kind::Q4_0 => {
                        for p in 0..4 {
                            let mut low = [_mm256_setzero_si256(); O];
                            let mut high = [_mm256_setzero_si256(); O];
                            for oi in 0..O {
                                let v = weights(oi, p);
                                low[oi] = _mm256_and_si256(v, nibble_mask);
                                high[oi] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble_mask);
                            }
                            for ri in 0..R {
                                let (x0, x1) = (act(ri, 2 * p), act(ri, 2 * p + 1));
                                for (oi, row) in sums.iter_mut().enumerate() {
                                    row[ri] = dot(dot(row[ri], low[oi], x0), high[oi], x1);
                                }
                            }
                        }
                    }
                    Kind::Q8_0 => {
                        for j in 0..8 {
                            let mut wv = [_mm256_setzero_si256(); O];
                            for (oi, v) in wv.iter_mut().enumerate() {
                                *v = weights(oi, j);
                            }
                            for ri in 0..R {
                                let xv = act(ri, j);
                                for (row, v) in sums.iter_mut().zip(&wv) {
                                    row[ri] = if VNNI {
                                        dot(row[ri], xv, *v)
                                    } else {
                                        // The activations back to signed bytes (`x + 128` with its top bit
                                        // flipped), the weights' signs moved onto them.
                                        let signed = _mm256_xor_si256(xv, sign_bits);
                                        dot(
                                            row[ri],
                                            _mm256_abs_epi8(*v),
                                            _mm256_sign_epi8(signed, *v),
                                        )
                                    };
                                }
                            }
                        }
                    }
                }
                for (oi, (acc_row, sum_row)) in acc.iter_mut().zip(&sums).enumerate() {
                    // SAFETY: eight scales of group `g` (see above).
                    let sw = {
                        let at = w_scale_lanes(g).add((oi * GROUP + lane0) * scale_bytes);
                        if HALF {
                            _mm256_cvtph_ps(_mm_loadu_si128(at.cast()))
                        } else {
                            _mm256_loadu_ps(at.cast())
                        }
                    };
                    for (ri, (a, s)) in acc_row.iter_mut().zip(sum_row).enumerate() {
                        // SAFETY: as above.
                        let sx = {
                            _mm256_loadu_ps(x.scales.as_ptr().add((x_rows(ri) + g) * GROUP + lane0))
                        };
                        a[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(*s), _mm256_mul_ps(sw, sx), a[h]);
                    }
                }
            }
        }
        for (oi, row) in acc.iter().enumerate() {
            for (ri, a) in row.iter().enumerate() {
                store(o + oi, r0 + ri, reduce(a[0], a[1]));
            }
        }
    }
}

/// Prefetches `lines` cache lines `ahead` bytes past `at` (the weight stream, or a pair's lanes of one group).
#[inline(always)]
fn prefetch(at: *const u8, ahead: usize, lines: usize) {
    let ahead = at.wrapping_add(ahead);
    for line in 0..lines {
        // SAFETY: a prefetch reads nothing the program sees, wherever it points; SSE is in the x86-64 baseline.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line).cast()) };
    }
}

/// The 16 lanes (`low` 0–7, `high` 8–15) summed in the VNNI kernel's tree: lanes 8 apart, then 4, 2, 1.
#[inline(always)]
fn reduce(low: __m256, high: __m256) -> f32 {
    // SAFETY: AVX is enabled wherever this inlines (the kernels' target features); no memory is touched.
    unsafe {
        let v = _mm256_add_ps(low, high);
        let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        let v = _mm_add_ss(v, _mm_movehdup_ps(v));
        _mm_cvtss_f32(v)
    }
}
