//! Convolutions over channel-major signals `x[channels][len]`.
//!
//! A dilated convolution is a sum over kernel taps of GEMMs on column-shifted views of the input; a transposed
//! convolution is split by output phase, so that every tap is again one GEMM whose output columns are strided by
//! the stride. Both are tiled in time so the output tile stays in cache while the taps accumulate into it.

use crate::gemm_call::{for_column_tiles, matmul, MatMut, MatRef, SharedOut};
use crate::par::chunks_mut;

/// Output columns per time tile: the output tile stays in L2 across the taps.
const TIME_TILE: usize = 256;

/// Splits `w[cout][cin][k]` (or, transposed, `w[cin][cout][k]`) into per-tap `[cout][cin]` panels.
fn tap_panels(w: &[f32], cout: usize, cin: usize, k: usize, transposed: bool) -> Vec<f32> {
    let mut taps = vec![0.0; k * cout * cin];
    for o in 0..cout {
        for i in 0..cin {
            for t in 0..k {
                let src = if transposed {
                    (i * cout + o) * k + t
                } else {
                    (o * cin + i) * k + t
                };
                taps[(t * cout + o) * cin + i] = w[src];
            }
        }
    }
    taps
}

/// A `Conv1d` weight, repacked as `k` tap panels `[cout][cin]`.
pub struct ConvWeight {
    taps: Vec<f32>,
    bias: Vec<f32>,
    cout: usize,
    cin: usize,
    k: usize,
}

impl ConvWeight {
    pub fn new(w: &[f32], cout: usize, cin: usize, k: usize, bias: Option<&[f32]>) -> Self {
        assert_eq!(w.len(), cout * cin * k, "conv1d weight size");
        let bias = bias.map_or_else(|| vec![0.0; cout], <[f32]>::to_vec);
        assert_eq!(bias.len(), cout, "conv1d bias size");
        ConvWeight {
            taps: tap_panels(w, cout, cin, k, false),
            bias,
            cout,
            cin,
            k,
        }
    }

    pub fn forward(
        &self,
        x: &[f32],
        len: usize,
        dilation: usize,
        y: &mut [f32],
        par: gemm::Parallelism,
    ) {
        let (cout, cin, k) = (self.cout, self.cin, self.k);
        let span = (k - 1) * dilation;
        assert!(len > span, "conv1d input shorter than the kernel span");
        let lout = len - span;
        assert_eq!(x.len(), cin * len, "conv1d input size");
        assert_eq!(y.len(), cout * lout, "conv1d output size");
        for (row, b) in y.chunks_exact_mut(lout).zip(&self.bias) {
            row.fill(*b);
        }
        let out = SharedOut::new(y);
        for_column_tiles(lout, TIME_TILE, par, |c0, c1, par| {
            for tap in 0..k {
                // SAFETY: tiles cover disjoint column ranges of `y`.
                let dst = unsafe { MatMut::from_shared(out, c0, cout, c1 - c0, lout as isize, 1) };
                let w = MatRef::new(&self.taps, tap * cout * cin, cout, cin, cin as isize, 1);
                let xs = MatRef::new(x, c0 + tap * dilation, cin, c1 - c0, len as isize, 1);
                matmul(dst, w, xs, true, par);
            }
        });
    }
}

/// A depthwise `Conv1d` weight `[c][k]`.
pub struct DepthwiseWeight {
    w: Vec<f32>,
    bias: Vec<f32>,
    k: usize,
}

impl DepthwiseWeight {
    pub fn new(w: &[f32], channels: usize, k: usize, bias: Option<&[f32]>) -> Self {
        assert_eq!(w.len(), channels * k, "depthwise weight size");
        let bias = bias.map_or_else(|| vec![0.0; channels], <[f32]>::to_vec);
        assert_eq!(bias.len(), channels, "depthwise bias size");
        DepthwiseWeight {
            w: w.to_vec(),
            bias,
            k,
        }
    }

    pub fn forward(&self, parallel: bool, x: &[f32], len: usize, y: &mut [f32]) {
        let k = self.k;
        let channels = self.bias.len();
        assert!(len >= k, "depthwise input shorter than the kernel");
        let lout = len - (k - 1);
        assert_eq!(x.len(), channels * len, "depthwise input size");
        assert_eq!(y.len(), channels * lout, "depthwise output size");
        chunks_mut(parallel, y, lout, |c, row| {
            let xs = &x[c * len..(c + 1) * len];
            let ws = &self.w[c * k..(c + 1) * k];
            row.fill(self.bias[c]);
            for (tap, &wt) in ws.iter().enumerate() {
                for (o, &xv) in row.iter_mut().zip(&xs[tap..tap + lout]) {
                    *o += wt * xv;
                }
            }
        });
    }
}

/// A `ConvTranspose1d` weight, repacked as `k` tap panels `[cout][cin]`.
pub struct ConvTransposeWeight {
    taps: Vec<f32>,
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
}

impl ConvTransposeWeight {
    pub fn new(w: &[f32], cin: usize, cout: usize, k: usize, stride: usize) -> Self {
        assert_eq!(w.len(), cin * cout * k, "transposed conv weight size");
        assert!(stride >= 1, "transposed conv stride");
        ConvTransposeWeight {
            taps: tap_panels(w, cout, cin, k, true),
            cin,
            cout,
            k,
            stride,
        }
    }

    /// `y[co][m·s + r] = Σ_j Σ_ci w[ci][co][r + j·s] · x[ci][m − j]`: for each output phase `r` and tap
    /// `r + j·s`, one GEMM into the columns `r, r + s, r + 2s, …` of `y`. Tiles run over `m`, so concurrent tiles
    /// write disjoint outputs.
    pub fn forward(&self, x: &[f32], len: usize, y: &mut [f32], par: gemm::Parallelism) {
        let (cin, cout, k, s) = (self.cin, self.cout, self.k, self.stride);
        assert!(len >= 1, "transposed conv of an empty input");
        let lfull = (len - 1) * s + k;
        assert_eq!(x.len(), cin * len, "transposed conv input size");
        assert_eq!(y.len(), cout * lfull, "transposed conv output size");
        y.fill(0.0);
        let positions = lfull.div_ceil(s);
        let out = SharedOut::new(y);
        for_column_tiles(positions, TIME_TILE, par, |m0, m1, par| {
            for tap in 0..k {
                let (r, j) = (tap % s, tap / s);
                // input columns t = m − j for m in [m0, m1), clipped to [0, len)
                let t0 = m0.saturating_sub(j);
                let t1 = (m1.saturating_sub(j)).min(len);
                if t0 >= t1 {
                    continue;
                }
                let first_out = (t0 + j) * s + r;
                // SAFETY: tiles cover disjoint ranges of m, hence disjoint output columns.
                let dst = unsafe {
                    MatMut::from_shared(out, first_out, cout, t1 - t0, lfull as isize, s as isize)
                };
                let w = MatRef::new(&self.taps, tap * cout * cin, cout, cin, cin as isize, 1);
                let xs = MatRef::new(x, t0, cin, t1 - t0, len as isize, 1);
                matmul(dst, w, xs, true, par);
            }
        });
    }
}
