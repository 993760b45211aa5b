//! Weights in the DSP's layouts, made at upload. Pure functions, tested on the host.
//!
//! **HVX matvec (Q8_0, Q4_0).** Output rows go in tiles of 32, one per 32-bit lane of a 128-byte HVX vector;
//! each lane holds 4 consecutive weights of its row, so `vrmpy` (4 byte products summed per lane) with 4
//! activation bytes broadcast from a scalar advances 32 rows by 4 inputs. Per tile and 32-weight block:
//! Q8_0 takes 8 vectors (g = 0..8: lane i = row i, weights 4g..4g+4); Q4_0 takes 4 vectors whose byte holds
//! weight 4g+k in its low nibble and 16+4g+k in its high nibble, ggml's pairing within a block, so a mask and
//! a shift give the two Q8-style vectors. The block scales follow as `f32[tile][block][32 lanes]`. Rows past
//! `out` are zero.
//!
//! **HMX fp16 tiles.** A matrix in 32×32 fp16 tiles, tile-major (`[row tile][column tile]`), row-major inside a
//! tile, zero-padded. Convolutions become matmuls through im2col: the weight `[cout][cin][k]` as
//! `[cout][k·cin]` (column `j·cin + ci`, so a k=7 conv is 7 accumulated tile GEMMs over `cin`), the input as
//! `[lout][k·cin]` rows.

use half::f16;
use kazeia_backend_abi::WeightFormat;

pub const BLOCK: usize = 32;
pub const LANES: usize = 32;
pub const TILE: usize = 32;

/// Quantised rows as the CPU backend stores them (ggml's Q8_0/Q4_0 blocks, row-major).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantRows {
    pub format: WeightFormat,
    pub out: usize,
    pub padded_in: usize,
    /// `[out][padded_in / 32]`.
    pub scales: Vec<f32>,
    /// Q8_0: `i8 [out][padded_in]` as bytes; Q4_0: `[out][padded_in / 2]` nibble pairs.
    pub data: Vec<u8>,
    pub bias: Option<Vec<f32>>,
}

impl QuantRows {
    /// The CPU backend's own quantisation (so DSP and CPU hold the same numbers), read from the bytes of
    /// `LinearWeight::export`.
    pub fn from_cpu_export(bytes: &[u8]) -> Result<QuantRows, String> {
        let mut at = 0usize;
        let mut take = |n: usize| -> Result<&[u8], String> {
            let s = bytes.get(at..at + n).ok_or("truncated CPU weight export")?;
            at += n;
            Ok(s)
        };
        let _magic = take(4)?;
        let code = u32::from_le_bytes(take(4)?.try_into().unwrap());
        let format = WeightFormat::from_code(code).ok_or("unknown weight format")?;
        if !matches!(format, WeightFormat::Q8_0 | WeightFormat::Q4_0) {
            return Err(format!("{format} weights have no HVX matvec layout"));
        }
        let mut dims = [0usize; 3];
        for d in &mut dims {
            *d = u64::from_le_bytes(take(8)?.try_into().unwrap()) as usize;
        }
        let [out, _inp, padded_in] = dims;
        let has_bias = take(1)?[0] != 0;
        let f32s = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        let n = out * padded_in;
        let scales = f32s(take(n / BLOCK * 4)?);
        let data = take(if format == WeightFormat::Q8_0 {
            n
        } else {
            n / 2
        })?
        .to_vec();
        let bias = if has_bias {
            Some(f32s(take(out * 4)?))
        } else {
            None
        };
        Ok(QuantRows {
            format,
            out,
            padded_in,
            scales,
            data,
            bias,
        })
    }

    pub fn blocks(&self) -> usize {
        self.padded_in / BLOCK
    }

    /// Bytes of one block of one row.
    fn block_bytes(&self) -> usize {
        if self.format == WeightFormat::Q8_0 {
            BLOCK
        } else {
            BLOCK / 2
        }
    }
}

/// A linear weight in the HVX matvec layout.
#[derive(Clone, Debug, PartialEq)]
pub struct HvxLinear {
    pub format: WeightFormat,
    pub out: usize,
    pub padded_in: usize,
    pub quants: Vec<u8>,
    /// `[tile][block][32]`.
    pub scales: Vec<f32>,
}

impl HvxLinear {
    pub fn tiles(&self) -> usize {
        self.out.div_ceil(LANES)
    }
}

/// Vectors of 128 bytes per tile and block.
fn vectors(format: WeightFormat) -> usize {
    if format == WeightFormat::Q8_0 {
        8
    } else {
        4
    }
}

pub fn to_hvx(rows: &QuantRows) -> HvxLinear {
    let (nb, bb, nv) = (rows.blocks(), rows.block_bytes(), vectors(rows.format));
    let tiles = rows.out.div_ceil(LANES);
    let mut quants = vec![0u8; tiles * nb * nv * 128];
    let mut scales = vec![0f32; tiles * nb * LANES];
    for o in 0..rows.out {
        let (tile, lane) = (o / LANES, o % LANES);
        for b in 0..nb {
            scales[(tile * nb + b) * LANES + lane] = rows.scales[o * nb + b];
            let src = &rows.data[(o * nb + b) * bb..][..bb];
            for (j, &byte) in src.iter().enumerate() {
                let (g, k) = (j / 4, j % 4);
                quants[((tile * nb + b) * nv + g) * 128 + lane * 4 + k] = byte;
            }
        }
    }
    HvxLinear {
        format: rows.format,
        out: rows.out,
        padded_in: rows.padded_in,
        quants,
        scales,
    }
}

/// The inverse of [`to_hvx`] (without the bias, which stays on the host).
pub fn from_hvx(w: &HvxLinear) -> QuantRows {
    let nb = w.padded_in / BLOCK;
    let nv = vectors(w.format);
    let bb = nv * 4;
    let mut scales = vec![0f32; w.out * nb];
    let mut data = vec![0u8; w.out * nb * bb];
    for o in 0..w.out {
        let (tile, lane) = (o / LANES, o % LANES);
        for b in 0..nb {
            scales[o * nb + b] = w.scales[(tile * nb + b) * LANES + lane];
            for j in 0..bb {
                let (g, k) = (j / 4, j % 4);
                data[(o * nb + b) * bb + j] =
                    w.quants[((tile * nb + b) * nv + g) * 128 + lane * 4 + k];
            }
        }
    }
    QuantRows {
        format: w.format,
        out: w.out,
        padded_in: w.padded_in,
        scales,
        data,
        bias: None,
    }
}

/// A matrix in HMX fp16 tiles.
#[derive(Clone, Debug, PartialEq)]
pub struct F16Tiles {
    pub rows: usize,
    pub cols: usize,
    /// `[row tile][col tile][32][32]` fp16 bits.
    pub data: Vec<u16>,
}

impl F16Tiles {
    pub fn row_tiles(&self) -> usize {
        self.rows.div_ceil(TILE)
    }
    pub fn col_tiles(&self) -> usize {
        self.cols.div_ceil(TILE)
    }

    /// Index of element `(r, c)` in `data`.
    pub fn index(&self, r: usize, c: usize) -> usize {
        ((r / TILE * self.col_tiles() + c / TILE) * TILE + r % TILE) * TILE + c % TILE
    }

    pub fn pack(m: &[f32], rows: usize, cols: usize) -> F16Tiles {
        assert_eq!(m.len(), rows * cols, "matrix size");
        let mut t = F16Tiles {
            rows,
            cols,
            data: Vec::new(),
        };
        t.data = vec![0; t.row_tiles() * t.col_tiles() * TILE * TILE];
        for r in 0..rows {
            for c in 0..cols {
                let i = t.index(r, c);
                t.data[i] = f16::from_f32(m[r * cols + c]).to_bits();
            }
        }
        t
    }

    /// The matrix back as f32 (the fp16 values, padding dropped).
    pub fn unpack(&self) -> Vec<f32> {
        let mut m = vec![0f32; self.rows * self.cols];
        for r in 0..self.rows {
            for c in 0..self.cols {
                m[r * self.cols + c] = f16::from_bits(self.data[self.index(r, c)]).to_f32();
            }
        }
        m
    }
}

/// A `Conv1d` weight `[cout][cin][k]` as the im2col matrix `[cout][k·cin]` in tiles.
pub fn conv_weight_tiles(w: &[f32], cout: usize, cin: usize, k: usize) -> F16Tiles {
    assert_eq!(w.len(), cout * cin * k, "conv weight size");
    let mut m = vec![0f32; cout * k * cin];
    for co in 0..cout {
        for ci in 0..cin {
            for j in 0..k {
                m[co * k * cin + j * cin + ci] = w[(co * cin + ci) * k + j];
            }
        }
    }
    F16Tiles::pack(&m, cout, k * cin)
}

/// The input `x[cin][len]` of a valid dilated conv as im2col rows `[lout][k·cin]` in tiles.
pub fn im2col_tiles(x: &[f32], cin: usize, len: usize, k: usize, dilation: usize) -> F16Tiles {
    assert_eq!(x.len(), cin * len, "input size");
    let lout = len + 1 - ((k - 1) * dilation + 1).min(len + 1);
    let mut m = vec![0f32; lout * k * cin];
    for t in 0..lout {
        for j in 0..k {
            for ci in 0..cin {
                m[t * k * cin + j * cin + ci] = x[ci * len + t + j * dilation];
            }
        }
    }
    F16Tiles::pack(&m, lout, k * cin)
}

/// A `ConvTranspose1d` (`w[cin][cout][k]`, `stride`) as `stride` convolutions over the same input, one per output
/// phase: output column `q·stride + p` of the full transposed convolution is column `q` of phase `p`'s valid conv1d
/// over `x` padded with `taps − 1` zeros on both sides, where `taps = ceil(k / stride)` and phase `p`'s kernel is
/// `w'[co][ci][j] = w[ci][co][p + (taps − 1 − j)·stride]` (zero past `k`). Each phase's kernel comes back as im2col
/// weight tiles; [`conv_transpose_input_tiles`] is the shared input.
pub fn conv_transpose_phase_tiles(
    w: &[f32],
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
) -> Vec<F16Tiles> {
    assert_eq!(w.len(), cin * cout * k, "transposed conv weight size");
    assert!(stride >= 1 && k >= 1, "stride and kernel");
    let taps = k.div_ceil(stride);
    (0..stride)
        .map(|p| {
            let mut phase = vec![0f32; cout * cin * taps];
            for co in 0..cout {
                for ci in 0..cin {
                    for j in 0..taps {
                        let tap = p + (taps - 1 - j) * stride;
                        if tap < k {
                            phase[(co * cin + ci) * taps + j] = w[(ci * cout + co) * k + tap];
                        }
                    }
                }
            }
            conv_weight_tiles(&phase, cout, cin, taps)
        })
        .collect()
}

/// `x[cin][len]` with `pad` zeros on both sides of each row: `[cin][len + 2·pad]`.
pub fn pad_columns(x: &[f32], cin: usize, len: usize, pad: usize) -> Vec<f32> {
    let width = len + 2 * pad;
    let mut padded = vec![0f32; cin * width];
    for ci in 0..cin {
        padded[ci * width + pad..ci * width + pad + len]
            .copy_from_slice(&x[ci * len..(ci + 1) * len]);
    }
    padded
}

/// The input of every phase of [`conv_transpose_phase_tiles`]: `x[cin][len]` padded with `taps − 1` zeros on both
/// sides ([`pad_columns`]), as im2col rows `[len + taps − 1][taps·cin]` in tiles.
pub fn conv_transpose_input_tiles(x: &[f32], cin: usize, len: usize, taps: usize) -> F16Tiles {
    let padded = pad_columns(x, cin, len, taps - 1);
    im2col_tiles(&padded, cin, len + 2 * (taps - 1), taps, 1)
}

/// Scatters phase `p`'s product `y_p[q][cout]` into the full transposed convolution `y[cout][full]` (the columns
/// `q·stride + p < full`).
pub fn scatter_phase(
    y_p: &[f32],
    p: usize,
    stride: usize,
    cout: usize,
    y: &mut [f32],
    full: usize,
) {
    for (q, row) in y_p.chunks_exact(cout).enumerate() {
        let column = q * stride + p;
        if column >= full {
            break;
        }
        for (co, v) in row.iter().enumerate() {
            y[co * full + column] = *v;
        }
    }
}

/// `y[m][n] = Σ_k a[m][k] · b[n][k]` over tiles, accumulated in f32 tile by tile along k as HMX does
/// (the reference for the HMX kernel; `b` is the weight, `a` the im2col input).
pub fn tile_matmul(a: &F16Tiles, b: &F16Tiles) -> Vec<f32> {
    assert_eq!(a.cols, b.cols, "inner dimensions");
    let (m, n) = (a.rows, b.rows);
    let mut y = vec![0f32; m * n];
    for kt in 0..a.col_tiles() {
        for r in 0..m {
            for c in 0..n {
                let mut acc = 0f32;
                for kk in 0..TILE {
                    let col = kt * TILE + kk;
                    if col >= a.cols {
                        break;
                    }
                    let av = f16::from_bits(a.data[a.index(r, col)]).to_f32();
                    let bv = f16::from_bits(b.data[b.index(c, col)]).to_f32();
                    acc += av * bv;
                }
                y[r * n + c] += acc;
            }
        }
    }
    y
}

/// Inner-dimension tiles the HMX path sums in its fp16 accumulator before adding the read-back to the f32 output
/// (`KZ_MAX_GROUP` in `dsp/tile_matmul.h`).
pub const MAX_GROUP: usize = 8;

/// The HMX path's result (`dsp/tile_matmul.c` with its engine model `dsp/tile_emulated.c`), bit for bit:
/// `y[m][n] = Σ_k a[m][k] · b[n][k]` where, per 32×32 output tile, `group` inner tiles are summed in f32 (tile by
/// tile, then element by element along k, the zero padding included), that sum is rounded to fp16 (the
/// accumulator's read-back), and the groups' read-backs are added to `y` in f32.
pub fn tile_matmul_grouped(a: &F16Tiles, b: &F16Tiles, group: usize) -> Vec<f32> {
    assert_eq!(a.cols, b.cols, "inner dimensions");
    assert!(
        (1..=MAX_GROUP).contains(&group),
        "group of 1..={MAX_GROUP} tiles"
    );
    let (m, n, kts) = (a.rows, b.rows, a.col_tiles());
    let value = |t: &F16Tiles, tile: usize, i: usize| {
        f16::from_bits(t.data[tile * TILE * TILE + i]).to_f32()
    };
    let mut y = vec![0f32; m * n];
    for mt in 0..a.row_tiles() {
        for g0 in (0..kts).step_by(group) {
            for nt in 0..b.row_tiles() {
                for r in 0..TILE {
                    for c in 0..TILE {
                        let mut acc = 0f32;
                        for kt in g0..(g0 + group).min(kts) {
                            let (at, bt) = (mt * kts + kt, nt * kts + kt);
                            for i in 0..TILE {
                                acc += value(a, at, r * TILE + i) * value(b, bt, c * TILE + i);
                            }
                        }
                        let (row, col) = (mt * TILE + r, nt * TILE + c);
                        if row < m && col < n {
                            y[row * n + col] += f16::from_f32(acc).to_f32();
                        }
                    }
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
    use kazeia_backend_cpu::{CpuBackend, LinearWeight};
    use kazeia_tests::values;

    fn cpu_rows(out: usize, inp: usize, format: WeightFormat) -> QuantRows {
        let w = values(out * inp, out as u32);
        let bias = values(out, 9);
        let lw = LinearWeight::new(&w, out, inp, Some(&bias), format);
        QuantRows::from_cpu_export(&lw.export()).unwrap()
    }

    #[test]
    fn hvx_layouts_round_trip_and_put_each_row_in_its_lane() {
        for format in [WeightFormat::Q8_0, WeightFormat::Q4_0] {
            // 70 rows: two full tiles and a padded one; 100 inputs: 4 blocks, the last zero-padded.
            let rows = cpu_rows(70, 100, format);
            assert_eq!((rows.out, rows.padded_in), (70, 128));
            let hvx = to_hvx(&rows);
            assert_eq!(hvx.tiles(), 3);
            assert_eq!(hvx.quants.len(), 3 * 4 * vectors(format) * 128);
            let mut back = from_hvx(&hvx);
            back.bias = rows.bias.clone();
            assert_eq!(back, rows);
            // Row 37 is lane 5 of tile 1; its block 2 weights 4..8 are vector g=1 of that block.
            let nb = 4;
            let v = |g: usize| (nb + 2) * vectors(format) + g;
            let bb = if format == WeightFormat::Q8_0 { 32 } else { 16 };
            assert_eq!(
                &hvx.quants[v(1) * 128 + 5 * 4..][..4],
                &rows.data[(37 * nb + 2) * bb + 4..][..4]
            );
            assert_eq!(hvx.scales[(nb + 2) * 32 + 5], rows.scales[37 * nb + 2]);
            // Padding rows (70..96) are zero.
            let tile2 = &hvx.scales[2 * nb * 32..];
            assert!(tile2
                .chunks(32)
                .all(|lanes| lanes[6..].iter().all(|&s| s == 0.0)));
        }
    }

    #[test]
    fn a_cpu_export_in_another_format_is_refused() {
        let lw = LinearWeight::new(&values(64, 1), 2, 32, None, WeightFormat::F16);
        let err = QuantRows::from_cpu_export(&lw.export()).unwrap_err();
        assert_eq!(err, "f16 weights have no HVX matvec layout");
        let lw = LinearWeight::new(&values(64, 1), 2, 32, None, WeightFormat::Q8_0);
        let bytes = lw.export();
        assert!(QuantRows::from_cpu_export(&bytes[..bytes.len() - 3]).is_err());
    }

    #[test]
    fn fp16_tiles_round_trip_with_zero_padding() {
        let m = values(40 * 70, 3);
        let t = F16Tiles::pack(&m, 40, 70);
        assert_eq!((t.row_tiles(), t.col_tiles()), (2, 3));
        assert_eq!(t.data.len(), 6 * 1024);
        let back = t.unpack();
        for (a, b) in m.iter().zip(&back) {
            assert_eq!(*b, f16::from_f32(*a).to_f32());
        }
        // Everything outside the 40×70 matrix is zero, and element (33, 65) is in tile (1, 2) at (1, 1).
        let nonzero_padding = (0..64)
            .flat_map(|r| (0..96).map(move |c| (r, c)))
            .filter(|&(r, c)| r >= 40 || c >= 70)
            .filter(|&(r, c)| t.data[t.index(r, c)] != 0)
            .count();
        assert_eq!(nonzero_padding, 0);
        assert_eq!(t.index(33, 65), (5 * 32 + 1) * 32 + 1);
    }

    #[test]
    fn im2col_tile_gemm_is_the_cpu_conv1d_up_to_fp16_rounding() {
        let (cout, cin, k, len, dilation) = (20, 12, 7, 50, 3);
        let w = values(cout * cin * k, 4);
        let bias = vec![0.0; cout];
        let x = values(cin * len, 5);
        let cpu = CpuBackend::new(1);
        let weight = cpu.upload_conv1d(&w, cout, cin, k, Some(&bias));
        let lout = len - (k - 1) * dilation;
        let mut want = vec![0.0; cout * lout];
        cpu.conv1d(&weight, &x, len, dilation, &mut want);
        let a = im2col_tiles(&x, cin, len, k, dilation);
        let b = conv_weight_tiles(&w, cout, cin, k);
        assert_eq!((a.rows, a.cols, b.rows), (lout, k * cin, cout));
        let y = tile_matmul(&a, &b);
        for co in 0..cout {
            for t in 0..lout {
                // Each product's two fp16 roundings move it by at most 2·2⁻¹¹ of |w·x|.
                let bound: f32 = (0..cin)
                    .flat_map(|ci| (0..k).map(move |j| (ci, j)))
                    .map(|(ci, j)| {
                        (w[(co * cin + ci) * k + j] * x[ci * len + t + j * dilation]).abs()
                    })
                    .sum::<f32>()
                    * 2.0
                    * 2f32.powi(-11)
                    + 1e-5;
                let diff = (y[t * cout + co] - want[co * lout + t]).abs();
                assert!(diff <= bound, "({co}, {t}): {diff} > {bound}");
            }
        }
    }

    #[test]
    fn the_hmx_model_is_within_one_fp16_rounding_of_each_group_of_the_f32_tile_product() {
        // Its accumulator read-back rounds each group's partial sum to fp16: at most 2⁻¹¹ of the partial's
        // magnitude per group, bounded by the sum of |products|.
        let (m, n, k) = (37, 45, 300);
        let a = F16Tiles::pack(&values(m * k, 6), m, k);
        let b = F16Tiles::pack(&values(n * k, 7), n, k);
        let f32_sums = tile_matmul(&a, &b);
        let (am, bm) = (a.unpack(), b.unpack());
        for group in [1, 3, MAX_GROUP] {
            let y = tile_matmul_grouped(&a, &b, group);
            for r in 0..m {
                for c in 0..n {
                    let magnitude: f32 =
                        (0..k).map(|i| (am[r * k + i] * bm[c * k + i]).abs()).sum();
                    let bound = magnitude * 2f32.powi(-11) + 1e-5;
                    let diff = (y[r * n + c] - f32_sums[r * n + c]).abs();
                    assert!(diff <= bound, "group {group} ({r}, {c}): {diff} > {bound}");
                }
            }
        }
    }

    #[test]
    fn a_transposed_conv_as_phase_tile_products_is_the_cpu_one_up_to_fp16_rounding() {
        // The decoder's upsamplers: kernel 2·stride, and a kernel that is not a multiple of the stride.
        for &(cin, cout, k, stride, len) in &[(6, 5, 10, 5, 7), (4, 3, 7, 3, 9), (3, 2, 4, 4, 1)] {
            let w = values(cin * cout * k, 8);
            let x = values(cin * len, 9);
            let cpu = CpuBackend::new(1);
            let weight = cpu.upload_conv_transpose1d(&w, cin, cout, k, stride);
            let full = (len - 1) * stride + k;
            let mut want = vec![0.0; cout * full];
            cpu.conv_transpose1d(&weight, &x, len, &mut want);
            let taps = k.div_ceil(stride);
            let input = conv_transpose_input_tiles(&x, cin, len, taps);
            assert_eq!(input.rows, len + taps - 1);
            let mut y = vec![f32::NAN; cout * full];
            for (p, phase) in conv_transpose_phase_tiles(&w, cin, cout, k, stride)
                .iter()
                .enumerate()
            {
                scatter_phase(&tile_matmul(&input, phase), p, stride, cout, &mut y, full);
            }
            for co in 0..cout {
                for u in 0..full {
                    // Two fp16 roundings per product: at most 2·2⁻¹¹ of |w·x| each.
                    let bound: f32 = (0..cin)
                        .flat_map(|ci| (0..len).map(move |t| (ci, t)))
                        .filter(|&(_, t)| u >= t * stride && u - t * stride < k)
                        .map(|(ci, t)| {
                            (w[(ci * cout + co) * k + u - t * stride] * x[ci * len + t]).abs()
                        })
                        .sum::<f32>()
                        * 2.0
                        * 2f32.powi(-11)
                        + 1e-6;
                    let diff = (y[co * full + u] - want[co * full + u]).abs();
                    assert!(
                        diff <= bound,
                        "k {k} stride {stride} ({co}, {u}): {diff} > {bound}"
                    );
                }
            }
        }
    }
}
