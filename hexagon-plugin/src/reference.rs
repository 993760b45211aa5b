//! What each DSP kernel computes, bit for bit, written plainly over the CPU backend's row-major data (not the
//! DSP layouts), so a test comparing a kernel with it checks the repacking too.

use kazeia_backend_abi::WeightFormat;

use crate::repack::{QuantRows, BLOCK};

/// Activations as int8 blocks of 32 with one scale each (the rule of the CPU backend's integer kernels:
/// scale = max |x| / 127, q = round(x / scale)). `x` is zero-padded to `padded_in`.
pub fn quantize_activations(x: &[f32], padded_in: usize) -> (Vec<i8>, Vec<f32>) {
    let mut q = vec![0i8; padded_in];
    let mut scales = vec![0f32; padded_in / BLOCK];
    for (b, scale) in scales.iter_mut().enumerate() {
        let block: Vec<f32> = (0..BLOCK)
            .map(|j| x.get(b * BLOCK + j).copied().unwrap_or(0.0))
            .collect();
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (j, v) in block.iter().enumerate() {
            q[b * BLOCK + j] = (v * inv).round().clamp(-127.0, 127.0) as i8;
        }
        *scale = d;
    }
    (q, scales)
}

/// The signed weight `j` (0..32) of block `b` of row `o`.
fn weight(w: &QuantRows, o: usize, b: usize, j: usize) -> i32 {
    let nb = w.blocks();
    match w.format {
        WeightFormat::Q8_0 => w.data[(o * nb + b) * BLOCK + j] as i8 as i32,
        _ => {
            let byte = w.data[(o * nb + b) * BLOCK / 2 + j % 16];
            let nibble = if j < 16 { byte & 0x0f } else { byte >> 4 };
            nibble as i32 - 8
        }
    }
}

/// `y[o] = Σ_b dot_b · (w_scale · x_scale)`, the integer block dot products exact, the sum in f32 in block
/// order without fused multiply-adds (the DSP kernel's exact arithmetic). No bias.
pub fn matvec(w: &QuantRows, xq: &[i8], xs: &[f32]) -> Vec<f32> {
    let nb = w.blocks();
    (0..w.out)
        .map(|o| {
            let mut acc = 0f32;
            for b in 0..nb {
                let dot: i32 = (0..BLOCK)
                    .map(|j| weight(w, o, b, j) * xq[b * BLOCK + j] as i32)
                    .sum();
                acc += dot as f32 * (w.scales[o * nb + b] * xs[b]);
            }
            acc
        })
        .collect()
}

/// Valid dilated conv on int16: `x[cin][len]`, `w[cout][cin][k]` → `y[cout][len − (k−1)·d]` in wrapping i32.
pub fn conv1d_i16(
    w: &[i16],
    x: &[i16],
    (cout, cin, k): (usize, usize, usize),
    len: usize,
    dilation: usize,
) -> Vec<i32> {
    let lout = len - (k - 1) * dilation;
    let mut y = vec![0i32; cout * lout];
    for co in 0..cout {
        for ci in 0..cin {
            for j in 0..k {
                let wv = w[(co * cin + ci) * k + j] as i32;
                for t in 0..lout {
                    let p = wv.wrapping_mul(x[ci * len + t + j * dilation] as i32);
                    y[co * lout + t] = y[co * lout + t].wrapping_add(p);
                }
            }
        }
    }
    y
}

/// Full transposed conv on int16: `x[cin][len]`, `w[cin][cout][k]` → `y[cout][(len−1)·stride + k]`.
pub fn conv_transpose1d_i16(
    w: &[i16],
    x: &[i16],
    (cin, cout, k): (usize, usize, usize),
    len: usize,
    stride: usize,
) -> Vec<i32> {
    let lout = (len - 1) * stride + k;
    let mut y = vec![0i32; cout * lout];
    for ci in 0..cin {
        for co in 0..cout {
            for j in 0..k {
                let wv = w[(ci * cout + co) * k + j] as i32;
                for t in 0..len {
                    let i = co * lout + t * stride + j;
                    y[i] = y[i].wrapping_add(wv.wrapping_mul(x[ci * len + t] as i32));
                }
            }
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use kazeia_backend_abi::Backend;
    use kazeia_backend_cpu::CpuBackend;

    #[test]
    fn the_integer_matvec_is_the_cpu_linear_up_to_activation_rounding() {
        let (out, inp) = (40, 96);
        let w: Vec<f32> = (0..out * inp)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 60.0)
            .collect();
        let x: Vec<f32> = (0..inp)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) / 9.0)
            .collect();
        let cpu = CpuBackend::new(1);
        for format in [WeightFormat::Q8_0, WeightFormat::Q4_0] {
            let lw = cpu.upload_linear(&w, out, inp, None, format);
            let rows = QuantRows::from_cpu_export(&cpu.export_linear(&lw).unwrap()).unwrap();
            let mut want = vec![0.0; out];
            cpu.linear(&lw, &x, 1, &mut want);
            let (xq, xs) = quantize_activations(&x, rows.padded_in);
            let y = matvec(&rows, &xq, &xs);
            for o in 0..out {
                // The int8 activations differ from x by at most half a step (scale/2) per value.
                let bound: f32 = (0..inp / BLOCK)
                    .map(|b| {
                        let wsum: f32 = (0..BLOCK)
                            .map(|j| {
                                (weight(&rows, o, b, j) as f32 * rows.scales[o * rows.blocks() + b])
                                    .abs()
                            })
                            .sum();
                        wsum * xs[b] * 0.5
                    })
                    .sum::<f32>()
                    + 1e-4;
                assert!(
                    (y[o] - want[o]).abs() <= bound,
                    "{format} row {o}: {} vs {}",
                    y[o],
                    want[o]
                );
            }
        }
    }
}
