//! Elementwise activations.

use rayon::prelude::*;

const CHUNK: usize = 4096;

pub fn snake_beta(x: &mut [f32], len: usize, alpha: &[f32], inv_beta: &[f32]) {
    assert_eq!(x.len(), alpha.len() * len, "snake_beta input size");
    assert_eq!(alpha.len(), inv_beta.len(), "snake_beta parameters");
    x.par_chunks_mut(len).enumerate().for_each(|(c, row)| {
        let (a, ib) = (alpha[c], inv_beta[c]);
        for v in row {
            let s = (*v * a).sin();
            *v += ib * (s * s);
        }
    });
}

pub fn gelu(x: &mut [f32]) {
    x.par_chunks_mut(CHUNK).for_each(|chunk| {
        for v in chunk {
            *v = *v * 0.5 * (1.0 + libm::erff(*v * std::f32::consts::FRAC_1_SQRT_2));
        }
    });
}

pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "silu_mul sizes");
    gate.par_chunks_mut(CHUNK)
        .zip(up.par_chunks(CHUNK))
        .for_each(|(g, u)| {
            for (g, u) in g.iter_mut().zip(u) {
                *g = *g / (1.0 + (-*g).exp()) * u;
            }
        });
}
