//! Offline 1-D convolutions for the encoders (speaker encoder, codec encoder): any stride and dilation, run
//! as an im2col product on a backend's linear op, over already padded input. They run once per reference
//! recording, not per utterance, so clarity wins over streaming state.

use kazeia_backend_abi::{Backend, Weight};

use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::linear::upload_f32_linear;
use crate::weights::Weights;

/// Output rows of im2col built at once: bounds the patch buffer whatever the input length.
const PATCH_ROWS: usize = 4096;

pub struct Conv1d {
    weight: Weight,
    pub cin: usize,
    pub cout: usize,
    pub k: usize,
    pub stride: usize,
    pub dilation: usize,
}

impl Conv1d {
    /// `{prefix}.weight` `[cout][cin][k]` and, if `bias`, `{prefix}.bias`.
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        backend: &dyn Backend,
        file: &dyn Weights,
        prefix: &str,
        (cin, cout, k): (usize, usize, usize),
        stride: usize,
        dilation: usize,
        bias: bool,
    ) -> Result<Self> {
        let w = file.tensor_shaped(&format!("{prefix}.weight"), &[cout, cin, k])?;
        let b = if bias {
            Some(file.tensor_shaped(&format!("{prefix}.bias"), &[cout])?)
        } else {
            None
        };
        // `[cout][cin][k]` is the `[cout][cin·k]` matrix of an im2col row laid out as (channel, tap).
        let weight = upload_f32_linear(backend, &w, cout, cin * k, b.as_deref())?;
        Ok(Conv1d {
            weight,
            cin,
            cout,
            k,
            stride: stride.max(1),
            dilation: dilation.max(1),
        })
    }

    /// Columns of the output of a valid convolution over `len` input columns.
    pub fn out_len(&self, len: usize) -> usize {
        let span = (self.k - 1) * self.dilation + 1;
        if len < span {
            0
        } else {
            (len - span) / self.stride + 1
        }
    }

    /// Valid convolution: `x[cin][len]` → `y[cout][out_len]`, bias added.
    pub fn forward(
        &self,
        backend: &dyn Backend,
        x: &[f32],
        len: usize,
    ) -> Result<(Vec<f32>, usize)> {
        if x.len() != self.cin * len {
            return Err(Error::Input(format!(
                "convolution input has {} values, expected {} channels × {len}",
                x.len(),
                self.cin
            )));
        }
        let out_len = self.out_len(len);
        let cols = self.cin * self.k;
        let mut rows_out = vec![0.0f32; out_len * self.cout];
        let mut patches = Vec::with_capacity(PATCH_ROWS.min(out_len) * cols);
        let mut g = Graph::new(backend);
        for start in (0..out_len).step_by(PATCH_ROWS) {
            let n = PATCH_ROWS.min(out_len - start);
            patches.clear();
            for t in start..start + n {
                let base = t * self.stride;
                for c in 0..self.cin {
                    let row = &x[c * len..(c + 1) * len];
                    patches.extend((0..self.k).map(|j| row[base + j * self.dilation]));
                }
            }
            let x = g.input(std::mem::take(&mut patches));
            let y = g.linear(&self.weight, &x, n, self.cout);
            rows_out[start * self.cout..(start + n) * self.cout].copy_from_slice(g.read(&y)?);
            drop(y);
            patches = g.take(x)?;
            patches.clear();
        }
        g.finish()?;
        Ok((transpose(&rows_out, out_len, self.cout), out_len))
    }
}

/// `[rows][cols]` → `[cols][rows]`.
pub fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = x[r * cols + c];
        }
    }
    out
}

/// How the columns added on either side are filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pad {
    Zeros,
    /// Mirror without repeating the edge (`torch` "reflect").
    Reflect,
    /// Repeat the edge column (`torch` "replicate").
    Replicate,
}

/// `x[channels][len]` with `left` and `right` columns added.
pub fn pad(
    x: &[f32],
    channels: usize,
    len: usize,
    left: usize,
    right: usize,
    mode: Pad,
) -> Result<Vec<f32>> {
    if mode == Pad::Reflect && (left >= len || right >= len) {
        return Err(Error::Input(format!(
            "reflect padding of {left}/{right} needs more than {len} columns (the input is too short)"
        )));
    }
    if mode == Pad::Replicate && len == 0 {
        return Err(Error::Input(
            "cannot replicate the edge of an empty input".into(),
        ));
    }
    let width = left + len + right;
    let mut out = vec![0.0; channels * width];
    for c in 0..channels {
        let src = &x[c * len..(c + 1) * len];
        let dst = &mut out[c * width..(c + 1) * width];
        dst[left..left + len].copy_from_slice(src);
        for i in 0..left {
            dst[i] = match mode {
                Pad::Zeros => 0.0,
                Pad::Reflect => src[left - i],
                Pad::Replicate => src[0],
            };
        }
        for i in 0..right {
            dst[left + len + i] = match mode {
                Pad::Zeros => 0.0,
                Pad::Reflect => src[len - 2 - i],
                Pad::Replicate => src[len - 1],
            };
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_modes_follow_torch() {
        let x = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(
            pad(&x, 1, 4, 2, 2, Pad::Reflect).unwrap(),
            [3.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 2.0]
        );
        assert_eq!(
            pad(&x, 1, 4, 1, 2, Pad::Replicate).unwrap(),
            [1.0, 1.0, 2.0, 3.0, 4.0, 4.0, 4.0]
        );
        assert_eq!(
            pad(&x, 1, 4, 1, 0, Pad::Zeros).unwrap(),
            [0.0, 1.0, 2.0, 3.0, 4.0]
        );
        assert!(pad(&x, 1, 4, 4, 0, Pad::Reflect).is_err());
    }
}
