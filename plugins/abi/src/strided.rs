//! Strided element-by-element ops between two buffers: the data movement and small arithmetic between a stage's
//! heavy ops (residual adds, per-channel scales and biases, transposes, concatenation of a convolution's carried
//! columns with a new chunk), so a whole stage can stay on a device.

/// Where element `(r, c)` of a 2-D view lies in its buffer: `offset + r·row_stride + c·col_stride`. A zero
/// stride repeats values (a per-channel vector broadcast over time).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct View {
    pub offset: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl View {
    /// Rows of `cols` consecutive values starting at `offset`, `row_stride` apart.
    pub fn rows(offset: usize, row_stride: usize) -> View {
        View {
            offset,
            row_stride,
            col_stride: 1,
        }
    }

    /// One value per row, repeated along it (a per-channel bias over time): `values[r]`.
    pub fn per_row() -> View {
        View {
            offset: 0,
            row_stride: 1,
            col_stride: 0,
        }
    }

    /// One value per column, the same for every row (a per-feature scale over positions): `values[c]`.
    pub fn per_column() -> View {
        View {
            offset: 0,
            row_stride: 0,
            col_stride: 1,
        }
    }

    /// The transpose of a matrix whose rows are `width` long: element `(r, c)` is `m[c][r]`.
    pub fn transposed(width: usize) -> View {
        View {
            offset: 0,
            row_stride: 1,
            col_stride: width,
        }
    }

    fn at(&self, r: usize, c: usize) -> usize {
        self.offset + r * self.row_stride + c * self.col_stride
    }

    /// The largest index of a `rows × cols` view, `None` if it overflows.
    fn last(&self, rows: usize, cols: usize) -> Option<usize> {
        let r = (rows - 1).checked_mul(self.row_stride)?;
        let c = (cols - 1).checked_mul(self.col_stride)?;
        self.offset.checked_add(r)?.checked_add(c)
    }
}

/// A `rows × cols` element-by-element op from a source view to a destination view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Strided {
    pub rows: usize,
    pub cols: usize,
    pub src: View,
    pub dst: View,
}

/// What a strided op does to each destination element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Combine {
    /// `dst = src`
    Copy = 0,
    /// `dst += src`
    Add = 1,
    /// `dst *= src`
    Mul = 2,
}

impl Strided {
    /// `n` consecutive values, from `src[0..n]` to `dst[0..n]`.
    pub fn contiguous(n: usize) -> Strided {
        Strided {
            rows: 1,
            cols: n,
            src: View::rows(0, n),
            dst: View::rows(0, n),
        }
    }

    /// `x[rows][cols]` → `y[cols][rows]`.
    pub fn transpose(rows: usize, cols: usize) -> Strided {
        Strided {
            rows,
            cols,
            src: View::rows(0, cols),
            dst: View::transposed(rows),
        }
    }

    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether no two elements of the destination view are the same element (so devices can write them in
    /// parallel): one stride nests inside the other.
    pub fn dst_is_injective(&self) -> bool {
        let (rs, cs) = (self.dst.row_stride, self.dst.col_stride);
        let (rows, cols) = (self.rows, self.cols);
        (rows <= 1 || rs > 0)
            && (cols <= 1 || cs > 0)
            && (rows <= 1 || cols <= 1 || rs >= cols * cs || cs >= rows * rs)
    }

    /// Checks the op against its buffers' lengths: both views inside, the destination injective.
    pub fn check(&self, src_len: usize, dst_len: usize) -> Result<(), String> {
        if self.is_empty() {
            return Ok(());
        }
        let inside =
            |view: &View, len: usize| view.last(self.rows, self.cols).is_some_and(|l| l < len);
        if !inside(&self.src, src_len) {
            return Err(format!(
                "a {}×{} strided op reads past its {src_len}-value source ({:?})",
                self.rows, self.cols, self.src
            ));
        }
        if !inside(&self.dst, dst_len) {
            return Err(format!(
                "a {}×{} strided op writes past its {dst_len}-value destination ({:?})",
                self.rows, self.cols, self.dst
            ));
        }
        if !self.dst_is_injective() {
            return Err(format!(
                "a strided op's destination view writes some elements twice ({:?})",
                self.dst
            ));
        }
        Ok(())
    }

    /// The destination elements `lo..hi` the op can write (`None` when it writes nothing).
    pub fn dst_range(&self) -> Option<(usize, usize)> {
        if self.is_empty() {
            return None;
        }
        let last = self.dst.last(self.rows, self.cols)?;
        Some((self.dst.offset, last + 1))
    }

    /// Whether the destination view is the whole `dst_len`-value buffer in order (a copy then overwrites it all).
    pub fn covers_dst(&self, dst_len: usize) -> bool {
        self.len() == dst_len
            && self.dst.offset == 0
            && self.dst.col_stride == 1
            && (self.rows <= 1 || self.dst.row_stride == self.cols)
    }
}

/// The host implementation (and the reference for device kernels). Panics on views outside the buffers.
pub fn strided_on_host(combine: Combine, src: &[f32], dst: &mut [f32], shape: Strided) {
    if let Err(e) = shape.check(src.len(), dst.len()) {
        panic!("{e}");
    }
    let cols = shape.cols;
    for r in 0..shape.rows {
        let d0 = shape.dst.at(r, 0);
        let s0 = shape.src.at(r, 0);
        // Rows of consecutive values (copies, adds, concatenation) and values repeated along a row (per-channel
        // biases and scales) run as plain slice loops.
        match (shape.dst.col_stride, shape.src.col_stride) {
            (1, 1) => {
                let d = &mut dst[d0..d0 + cols];
                let s = &src[s0..s0 + cols];
                match combine {
                    Combine::Copy => d.copy_from_slice(s),
                    Combine::Add => d.iter_mut().zip(s).for_each(|(d, s)| *d += s),
                    Combine::Mul => d.iter_mut().zip(s).for_each(|(d, s)| *d *= s),
                }
            }
            (1, 0) => {
                let d = &mut dst[d0..d0 + cols];
                let v = src[s0];
                match combine {
                    Combine::Copy => d.fill(v),
                    Combine::Add => d.iter_mut().for_each(|d| *d += v),
                    Combine::Mul => d.iter_mut().for_each(|d| *d *= v),
                }
            }
            _ => {
                for c in 0..cols {
                    let v = src[shape.src.at(r, c)];
                    let d = &mut dst[shape.dst.at(r, c)];
                    match combine {
                        Combine::Copy => *d = v,
                        Combine::Add => *d += v,
                        Combine::Mul => *d *= v,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_concatenate_and_broadcast() {
        let x: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let mut t = vec![0.0; 6];
        strided_on_host(Combine::Copy, &x, &mut t, Strided::transpose(2, 3));
        assert_eq!(t, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);

        // Two channels of a carried column then two new columns: [c][1 + 2].
        let carried = [10.0, 20.0];
        let new = [1.0, 2.0, 3.0, 4.0];
        let mut cat = vec![0.0; 6];
        let column = Strided {
            rows: 2,
            cols: 1,
            src: View::rows(0, 1),
            dst: View::rows(0, 3),
        };
        strided_on_host(Combine::Copy, &carried, &mut cat, column);
        let body = Strided {
            rows: 2,
            cols: 2,
            src: View::rows(0, 2),
            dst: View::rows(1, 3),
        };
        strided_on_host(Combine::Copy, &new, &mut cat, body);
        assert_eq!(cat, [10.0, 1.0, 2.0, 20.0, 3.0, 4.0]);

        // A per-channel bias over time (zero column stride on the source), then a scale.
        let bias = [0.5, -1.0];
        let per_channel = Strided {
            rows: 2,
            cols: 3,
            src: View {
                offset: 0,
                row_stride: 1,
                col_stride: 0,
            },
            dst: View::rows(0, 3),
        };
        strided_on_host(Combine::Add, &bias, &mut cat, per_channel);
        assert_eq!(cat, [10.5, 1.5, 2.5, 19.0, 2.0, 3.0]);
        strided_on_host(Combine::Mul, &[2.0, 0.0], &mut cat, per_channel);
        assert_eq!(cat, [21.0, 3.0, 5.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn views_outside_their_buffers_and_overlapping_writes_are_refused() {
        let s = Strided::contiguous(4);
        assert!(s.check(4, 4).is_ok());
        assert!(s.check(3, 4).unwrap_err().contains("reads past"));
        assert!(s.check(4, 3).unwrap_err().contains("writes past"));
        let mut repeated = s;
        repeated.dst.col_stride = 0;
        assert!(repeated.check(4, 4).unwrap_err().contains("twice"));
        let overflow = Strided {
            rows: 2,
            cols: 2,
            src: View::rows(usize::MAX - 1, 2),
            dst: View::rows(0, 2),
        };
        assert!(overflow.check(usize::MAX, 4).is_err());
        assert!(Strided::transpose(2, 3).dst_is_injective());
        assert!(Strided::transpose(2, 3).check(6, 6).is_ok());
        assert!(!Strided::transpose(2, 3).covers_dst(6));
        assert!(Strided::contiguous(6).covers_dst(6));
    }
}
