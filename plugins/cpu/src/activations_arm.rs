//! SnakeBeta with NEON intrinsics: the steps of [`crate::activations::sin_squared`] one for one (separate
//! multiplies and adds, no fused ones), eight values per iteration, so the result equals the portable code bit
//! for bit.

use std::arch::aarch64::*;

/// `row[i] += inv_beta · sin²(alpha · row[i])`.
pub fn snake_row(row: &mut [f32], alpha: f32, inv_beta: f32) {
    let n = row.len() / 8 * 8;
    // SAFETY: NEON is part of the aarch64 baseline; the loop stays within `row[..n]`.
    unsafe {
        let (a, ib) = (vdupq_n_f32(alpha), vdupq_n_f32(inv_beta));
        let p = row.as_mut_ptr();
        for i in (0..n).step_by(8) {
            let (x0, x1) = (vld1q_f32(p.add(i)), vld1q_f32(p.add(i + 4)));
            let s0 = sin_squared(vmulq_f32(x0, a));
            let s1 = sin_squared(vmulq_f32(x1, a));
            vst1q_f32(p.add(i), vaddq_f32(x0, vmulq_f32(ib, s0)));
            vst1q_f32(p.add(i + 4), vaddq_f32(x1, vmulq_f32(ib, s1)));
        }
    }
    for v in &mut row[n..] {
        *v += inv_beta * crate::activations::sin_squared(*v * alpha);
    }
}

#[inline(always)]
fn sin_squared(y: float32x4_t) -> float32x4_t {
    // SAFETY: NEON is part of the aarch64 baseline; no memory is touched.
    unsafe {
        const MAGIC: f32 = 12_582_912.0;
        const PIO2_HI: f32 = 1.570_312_5;
        const PIO2_MID: f32 = 4.838_267_6e-4;
        const PIO2_LO: f32 = 6.077_100_6e-11;
        let d = vdupq_n_f32;
        let shifted = vaddq_f32(vmulq_f32(y, d(std::f32::consts::FRAC_2_PI)), d(MAGIC));
        let odd = vtstq_u32(vreinterpretq_u32_f32(shifted), vdupq_n_u32(1));
        let k = vsubq_f32(shifted, d(MAGIC));
        let r = vsubq_f32(y, vmulq_f32(k, d(PIO2_HI)));
        let r = vsubq_f32(r, vmulq_f32(k, d(PIO2_MID)));
        let r = vsubq_f32(r, vmulq_f32(k, d(PIO2_LO)));
        let r2 = vmulq_f32(r, r);
        let poly = vaddq_f32(d(-1.0 / 5040.0), vmulq_f32(r2, d(1.0 / 362_880.0)));
        let poly = vaddq_f32(d(1.0 / 120.0), vmulq_f32(r2, poly));
        let poly = vaddq_f32(d(-1.0 / 6.0), vmulq_f32(r2, poly));
        let poly = vaddq_f32(d(1.0), vmulq_f32(r2, poly));
        let s = vmulq_f32(r, poly);
        let s2 = vmulq_f32(s, s);
        vbslq_f32(odd, vsubq_f32(d(1.0), s2), s2)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn neon_snake_equals_the_portable_loop_bit_for_bit() {
        // Lengths with and without a tail of the 8-wide loop; arguments over the range activations reach.
        for len in [1, 7, 8, 9, 100, 1027] {
            let x: Vec<f32> = (0..len)
                .map(|i| ((i as f32) * 0.731).sin() * 60.0 + (i % 5) as f32 * 0.01)
                .collect();
            for (alpha, inv_beta) in [(1.0, 1.0), (0.37, 2.5), (13.0, 0.01)] {
                let mut neon = x.clone();
                super::snake_row(&mut neon, alpha, inv_beta);
                let portable: Vec<f32> = x
                    .iter()
                    .map(|v| v + inv_beta * crate::activations::sin_squared(v * alpha))
                    .collect();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&neon), bits(&portable), "len {len} alpha {alpha}");
            }
        }
    }
}
