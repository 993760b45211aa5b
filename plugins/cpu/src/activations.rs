//! Elementwise activations.

use crate::par::chunks_mut;

const CHUNK: usize = 4096;

/// SnakeBeta on `x[channels][len]`: `x + inv_beta[c] · sin²(alpha[c] · x)`.
pub fn snake_beta(parallel: bool, x: &mut [f32], len: usize, alpha: &[f32], inv_beta: &[f32]) {
    assert_eq!(x.len(), alpha.len() * len, "snake_beta input size");
    assert_eq!(alpha.len(), inv_beta.len(), "snake_beta parameters");
    chunks_mut(parallel, x, len, |c, row| {
        snake_row(row, alpha[c], inv_beta[c])
    });
}

/// Runtime ISA dispatch: the same branch-free loop compiled for AVX-512, AVX2+FMA and the baseline.
fn snake_row(row: &mut [f32], alpha: f32, inv_beta: f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the feature was detected at run time.
            return unsafe { snake_row_avx512(row, alpha, inv_beta) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the features were detected at run time.
            return unsafe { snake_row_avx2(row, alpha, inv_beta) };
        }
    }
    #[cfg(target_arch = "aarch64")]
    return crate::activations_arm::snake_row(row, alpha, inv_beta);
    #[allow(unreachable_code)]
    snake_row_generic(row, alpha, inv_beta)
}

/// The portable loop compiled for AVX-512.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn snake_row_avx512(row: &mut [f32], alpha: f32, inv_beta: f32) {
    snake_row_generic(row, alpha, inv_beta)
}

/// The portable loop compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn snake_row_avx2(row: &mut [f32], alpha: f32, inv_beta: f32) {
    snake_row_generic(row, alpha, inv_beta)
}

#[inline(always)]
fn snake_row_generic(row: &mut [f32], alpha: f32, inv_beta: f32) {
    for v in row {
        *v += inv_beta * sin_squared(*v * alpha);
    }
}

/// `sin²(y)`, branch-free so that it vectorises: `y = k·π/2 + r` with `|r| ≤ π/4` (three-part Cody–Waite
/// reduction, exact enough for |y| up to ~10⁴), then `sin²(r)` for even `k` and `cos²(r) = 1 − sin²(r)` for odd
/// `k`. Taylor series to r⁹ on |r| ≤ π/4: truncation error below 2e-9.
#[inline(always)]
pub(crate) fn sin_squared(y: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2²³: adding it rounds to an integer in the low mantissa bits
    const PIO2_HI: f32 = 1.570_312_5;
    const PIO2_MID: f32 = 4.838_267_6e-4;
    const PIO2_LO: f32 = 6.077_100_6e-11;
    let shifted = y * std::f32::consts::FRAC_2_PI + MAGIC;
    let odd = shifted.to_bits() & 1;
    let k = shifted - MAGIC;
    let r = ((y - k * PIO2_HI) - k * PIO2_MID) - k * PIO2_LO;
    let r2 = r * r;
    let s = r
        * (1.0
            + r2 * (-1.0 / 6.0
                + r2 * (1.0 / 120.0 + r2 * (-1.0 / 5040.0 + r2 * (1.0 / 362_880.0)))));
    let s2 = s * s;
    if odd == 1 {
        1.0 - s2
    } else {
        s2
    }
}

pub fn gelu(parallel: bool, x: &mut [f32]) {
    chunks_mut(parallel, x, CHUNK, |_, chunk| {
        for v in chunk {
            *v = *v * 0.5 * (1.0 + libm::erff(*v * std::f32::consts::FRAC_1_SQRT_2));
        }
    });
}

pub fn silu(parallel: bool, x: &mut [f32]) {
    chunks_mut(parallel, x, CHUNK, |_, chunk| silu_rows(chunk, None));
}

pub fn silu_mul(parallel: bool, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "silu_mul sizes");
    chunks_mut(parallel, gate, CHUNK, |i, g| {
        silu_rows(g, Some(&up[i * CHUNK..i * CHUNK + g.len()]))
    });
}

/// `g ← g / (1 + e^(−g))`, times `up` when given: runtime ISA dispatch of one branch-free loop, as for SnakeBeta.
/// (With libm's scalar `expf`, the MLP's SiLU cost ~3.5 ns per value: 10 µs of every code-predictor layer.)
fn silu_rows(g: &mut [f32], up: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the feature was detected at run time.
            return unsafe { silu_rows_avx512(g, up) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the features were detected at run time.
            return unsafe { silu_rows_avx2(g, up) };
        }
    }
    silu_rows_generic(g, up)
}

/// The portable loop compiled for AVX-512.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn silu_rows_avx512(g: &mut [f32], up: Option<&[f32]>) {
    silu_rows_generic(g, up)
}

/// The portable loop compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_rows_avx2(g: &mut [f32], up: Option<&[f32]>) {
    silu_rows_generic(g, up)
}

#[inline(always)]
fn silu_rows_generic(g: &mut [f32], up: Option<&[f32]>) {
    match up {
        Some(up) => {
            for (g, &u) in g.iter_mut().zip(up) {
                *g = *g / (1.0 + exp(-*g)) * u;
            }
        }
        None => {
            for g in g {
                *g /= 1.0 + exp(-*g);
            }
        }
    }
}

/// `e^x`, branch-free so that it vectorises: `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2` (two-part Cody–Waite
/// reduction), `e^r` from Cephes' `expf` polynomial, `2^n` built in the exponent bits. Within 2 ulp of the exact
/// value for `x` in [−87.3, 88.3]; 0 below, ∞ above (where the exact value is under 1.3e-38 or over 2.1e38: SiLU
/// then gives what it gives with the exact value, `x` or a signed zero). A NaN stays NaN.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2²³: adding it rounds to an integer in the low mantissa bits
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // The reduction stays within normal powers of two; the selects below give what lies outside.
    let clamped = x.clamp(-87.3, 88.3);
    let shifted = clamped * std::f32::consts::LOG2_E + MAGIC;
    let n = shifted - MAGIC;
    let r = (clamped - n * LN2_HI) - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 0.166_666_65;
    let p = p * r + 0.5;
    let er = p * (r * r) + r + 1.0;
    // n ∈ [−126, 127]: a normal power of two, its biased exponent taken from the low bits of `shifted` (which
    // are `MAGIC`'s plus n) rather than through `n as i32`, whose saturating conversion does not vectorise.
    let two_n = f32::from_bits(
        shifted
            .to_bits()
            .wrapping_sub(MAGIC.to_bits())
            .wrapping_add(127)
            << 23,
    );
    let e = er * two_n;
    if x > 88.3 {
        f32::INFINITY
    } else if x < -87.3 {
        0.0
    } else if x.is_nan() {
        x
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::{exp, silu_rows, sin_squared};

    #[test]
    fn exp_is_within_two_ulp_over_the_range_silu_meets() {
        let mut x = -87.3f32;
        while x <= 88.3 {
            let exact = (x as f64).exp();
            let got = exp(x) as f64;
            let ulp = f32::EPSILON as f64 * exact;
            assert!(
                (got - exact).abs() <= 2.0 * ulp,
                "exp({x}) = {got}, exact {exact}"
            );
            x += 0.000_731;
        }
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(
            (exp(-87.4), exp(-1000.0), exp(f32::NEG_INFINITY)),
            (0.0, 0.0, 0.0)
        );
        assert_eq!(
            (exp(88.4), exp(1000.0), exp(f32::INFINITY)),
            (f32::INFINITY, f32::INFINITY, f32::INFINITY)
        );
    }

    #[test]
    fn silu_is_within_a_few_ulp_of_libm_and_every_isa_gives_the_same_bits() {
        let values: Vec<f32> = (0..4099)
            .map(|i| ((i as f32) * 0.618_034).sin() * 30.0 + if i % 97 == 0 { 500.0 } else { 0.0 })
            .chain([0.0, -0.0, 1e-30, -1e-30, 90.0, -90.0, 1e6, -1e6, f32::NAN])
            .collect();
        let up: Vec<f32> = values.iter().map(|v| 0.5 - v * 0.01).collect();
        let mut with_up = values.clone();
        silu_rows(&mut with_up, Some(&up));
        let mut plain = values.clone();
        silu_rows(&mut plain, None);
        let mut generic = values.clone();
        super::silu_rows_generic(&mut generic, Some(&up));
        for (i, &v) in values.iter().enumerate() {
            // libm's f32 `expf` in the same formula (what this replaced): e^−v overflows to ∞ from v ≈ −88.7,
            // this `exp` from −88.3, where SiLU is under 3e-37 in magnitude.
            let exact = (v / (1.0 + (-v).exp())) as f64;
            let tolerance = 4.0 * f32::EPSILON as f64 * exact.abs() + 1e-36;
            if v.is_nan() {
                assert!(plain[i].is_nan() && with_up[i].is_nan());
                continue;
            }
            assert!(
                (plain[i] as f64 - exact).abs() <= tolerance,
                "silu({v}) = {}, exact {exact}",
                plain[i]
            );
            assert_eq!(
                with_up[i].to_bits(),
                (plain[i] * up[i]).to_bits(),
                "silu({v}) · up"
            );
            assert_eq!(
                with_up[i].to_bits(),
                generic[i].to_bits(),
                "the vector loop and the plain one at {v}"
            );
        }
    }

    #[test]
    fn sin_squared_matches_libm_over_the_range_activations_reach() {
        let mut worst = 0.0f64;
        let mut y = -2000.0f32;
        while y < 2000.0 {
            let exact = (y as f64).sin().powi(2);
            worst = worst.max((sin_squared(y) as f64 - exact).abs());
            y += 0.0137;
        }
        // A few ulps of the f32 argument's own rounding at |y| = 2000 (ulp 1.2e-4) would be far larger; this
        // bounds the polynomial and the reduction.
        assert!(worst < 2e-6, "max error {worst:e}");
    }
}
