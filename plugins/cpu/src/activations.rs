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
    chunks_mut(parallel, x, CHUNK, |_, chunk| {
        for v in chunk {
            *v /= 1.0 + (-*v).exp();
        }
    });
}

pub fn silu_mul(parallel: bool, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "silu_mul sizes");
    chunks_mut(parallel, gate, CHUNK, |i, g| {
        for (g, u) in g.iter_mut().zip(&up[i * CHUNK..]) {
            *g = *g / (1.0 + (-*g).exp()) * u;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::sin_squared;

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
