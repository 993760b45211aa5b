//! Int8 activations for the integer dot products of Q8_0/Q4_0 linear layers, and the exact definition of those
//! products that the aarch64 NEON/SDOT/SMMLA kernels compute bit for bit ([`dot_reference`]). The x86 integer
//! kernels quantise the same way and sum in their own lane order (`linear_vnni.rs`).
//!
//! Each row of activations is cut into blocks of 32 and quantised like a Q8_0 weight block (`d = amax/127`,
//! round to nearest). A block product is then an exact `i32` sum; it is scaled by `d_w · d_x` and summed in
//! f32 into four partial sums, block `b` into sum `b mod 4`, which end as `(s0 + s1) + (s2 + s3)`. Fixing that
//! order is what lets a vector kernel (one lane per block) equal the scalar one exactly.

use crate::linear::{LinearWeight, Scales, Storage, BLOCK};

/// Quantises one block: returns its scale `d` and writes `round(v / d)`.
#[inline]
pub(crate) fn quantize_block(block: &[f32], quants: &mut [i8]) -> f32 {
    let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (q, v) in quants.iter_mut().zip(block) {
        *q = round_to_i8(v * inv);
    }
    d
}

/// `v.round().clamp(-127.0, 127.0) as i8` (half away from zero; NaN → 0) without a call to libm's `roundf`,
/// which x86-64's baseline has no instruction for: truncation and the exact remainder decide the rounding.
#[inline(always)]
fn round_to_i8(v: f32) -> i8 {
    let v = v.clamp(-128.0, 128.0); // past ±127.5 the result is ±127 either way; NaN stays NaN
    let t = v as i32; // NaN → 0
    let rest = v - t as f32; // exact: |v| ≤ 128
    let rounded = t + i32::from(rest >= 0.5) - i32::from(rest <= -0.5);
    rounded.clamp(-127, 127) as i8
}

/// `rows` rows of `k` activations (`k` a multiple of 32) as int8 blocks with one scale each; also, for the
/// SMMLA kernel, the same values with rows interleaved in pairs (see [`QuantizedActs::pairs`]).
pub(crate) struct QuantizedActs {
    /// `[rows][k]`.
    pub quants: Vec<i8>,
    /// `[rows][k / 32]`.
    pub scales: Vec<f32>,
    /// Rows `2p` and `2p + 1` interleaved by 8 values: `[pair][block][chunk 0..4][row 0..2][8]` (a missing odd
    /// last row is zeros). Empty unless asked for.
    pub pairs: Vec<i8>,
    /// `[pair][block][4]`: the scales of row `2p`, `2p`, `2p + 1`, `2p + 1` (the SMMLA result's lane order).
    pub pair_scales: Vec<f32>,
    pub rows: usize,
    pub k: usize,
}

impl QuantizedActs {
    pub fn new(x: &[f32], rows: usize, k: usize, with_pairs: bool) -> Self {
        assert!(k.is_multiple_of(BLOCK) && x.len() >= rows * k);
        let mut quants = vec![0i8; rows * k];
        let scales: Vec<f32> = x[..rows * k]
            .chunks_exact(BLOCK)
            .zip(quants.chunks_exact_mut(BLOCK))
            .map(|(xb, qb)| quantize_block(xb, qb))
            .collect();
        let (mut pairs, mut pair_scales) = (Vec::new(), Vec::new());
        if with_pairs {
            let (npairs, nb) = (rows.div_ceil(2), k / BLOCK);
            pairs = vec![0i8; npairs * 2 * k];
            pair_scales = vec![0.0f32; npairs * nb * 4];
            for r in 0..rows {
                let (p, half) = (r / 2, r % 2);
                for b in 0..nb {
                    for c in 0..4 {
                        let src = r * k + b * BLOCK + c * 8;
                        let dst = ((p * nb + b) * 4 + c) * 16 + half * 8;
                        pairs[dst..dst + 8].copy_from_slice(&quants[src..src + 8]);
                    }
                    let s = scales[r * nb + b];
                    pair_scales[(p * nb + b) * 4 + 2 * half] = s;
                    pair_scales[(p * nb + b) * 4 + 2 * half + 1] = s;
                }
            }
        }
        QuantizedActs {
            quants,
            scales,
            pairs,
            pair_scales,
            rows,
            k,
        }
    }
}

/// Weight element `i` of output row `o` as a signed integer (Q4_0: nibble − 8).
#[cfg(test)]
fn weight_q(w: &LinearWeight, o: usize, i: usize) -> i32 {
    let k = w.padded_in;
    match &w.storage {
        Storage::Q8_0 { quants, .. } => quants[o * k + i] as i32,
        Storage::Q4_0 { nibbles, .. } => {
            let (b, j) = (i / BLOCK, i % BLOCK);
            let byte = nibbles[(o * k + b * BLOCK) / 2 + j % (BLOCK / 2)];
            let nibble = if j < BLOCK / 2 {
                byte & 0x0f
            } else {
                byte >> 4
            };
            nibble as i32 - 8
        }
        _ => unreachable!("integer dot products are for Q8_0/Q4_0 weights"),
    }
}

#[cfg(test)]
#[test]
fn rounding_without_libm_equals_round_then_clamp() {
    let specials = [
        0.5f32,
        -0.5,
        1.5,
        -1.5,
        2.5,
        0.49999997,
        -0.49999997,
        126.5,
        127.49,
        127.5,
        -127.5,
        300.0,
        -1e9,
    ];
    let sweep = (-140_000..=140_000).map(|i| i as f32 / 997.0);
    for v in specials
        .into_iter()
        .chain(sweep)
        .chain([f32::NAN, f32::INFINITY, f32::NEG_INFINITY])
    {
        assert_eq!(round_to_i8(v), v.round().clamp(-127.0, 127.0) as i8, "{v}");
    }
}

pub(crate) fn weight_scales(w: &LinearWeight) -> &Scales {
    match &w.storage {
        Storage::Q8_0 { scales, .. } | Storage::Q4_0 { scales, .. } => scales,
        _ => unreachable!("integer dot products are for Q8_0/Q4_0 weights"),
    }
}

/// Values in [−1, 1] with a few blocks scaled up, all-zero and with outliers, so the int8 rounding, the ±127
/// clamp and zero scales all occur (the integer kernels' tests).
#[cfg(test)]
pub(crate) fn test_values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let v = (i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8;
            let base = (v % 2001) as f32 / 1000.0 - 1.0;
            match (i / BLOCK + seed as usize) % 7 {
                0 => base * 37.0,
                3 => 0.0,
                5 if i % 13 == 0 => base * 500.0,
                _ => base,
            }
        })
        .collect()
}

/// A Q8_0 and a Q4_0 layer with a bias, through `LinearWeight::forward` (on whichever integer kernel this CPU
/// runs) for each of `rows` rows, with 1 and 2 threads: [`dot_reference`] plus the bias, exactly.
#[cfg(test)]
pub(crate) fn check_layers_give_the_reference_plus_bias(rows: &[usize]) {
    use kazeia_backend_abi::WeightFormat;
    for format in [WeightFormat::Q8_0, WeightFormat::Q4_0] {
        let (out, inp) = (150, 70);
        let w = test_values(out * inp, 3);
        let bias = test_values(out, 4);
        let lw = LinearWeight::new(&w, out, inp, Some(&bias), format);
        let k = lw.padded_in;
        for &rows in rows {
            let x = test_values(rows * inp, 9 + rows as u32);
            let mut padded = vec![0.0; rows * k];
            for r in 0..rows {
                padded[r * k..r * k + inp].copy_from_slice(&x[r * inp..(r + 1) * inp]);
            }
            let mut want = vec![0.0f32; rows * out];
            let q = QuantizedActs::new(&padded, rows, k, false);
            dot_reference(&lw, &q, 0, out, &mut want);
            for (i, v) in want.iter_mut().enumerate() {
                *v += bias[i % out];
            }
            for par in [gemm::Parallelism::None, gemm::Parallelism::Rayon(2)] {
                let mut y = vec![0.0; rows * out];
                lw.forward(&x, rows, &mut y, par);
                assert_eq!(y, want, "{format} rows {rows} {par:?}");
            }
        }
    }
}

/// `partial[r][o − o0]` for `o` in `o0..o1`, in scalar code: the definition the vector kernels reproduce.
#[cfg(test)]
pub(crate) fn dot_reference(
    w: &LinearWeight,
    x: &QuantizedActs,
    o0: usize,
    o1: usize,
    partial: &mut [f32],
) {
    let (k, nb, width) = (w.padded_in, w.padded_in / BLOCK, o1 - o0);
    let ws = weight_scales(w);
    for r in 0..x.rows {
        for o in o0..o1 {
            let mut sums = [0.0f32; 4];
            for b in 0..nb {
                let dot: i32 = (b * BLOCK..(b + 1) * BLOCK)
                    .map(|i| weight_q(w, o, i) * x.quants[r * k + i] as i32)
                    .sum();
                let scale = ws.get(o * nb + b) * x.scales[r * nb + b];
                sums[b % 4] = (dot as f32).mul_add(scale, sums[b % 4]);
            }
            partial[r * width + (o - o0)] = (sums[0] + sums[1]) + (sums[2] + sums[3]);
        }
    }
}
