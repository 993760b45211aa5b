//! Linear layers (`y = x · wᵀ + b`) as one GEMM.

use crate::gemm_call::{matmul, MatMut, MatRef};

/// A `Linear` weight kept in PyTorch's `[out][in]` layout: GEMM reads it as the transposed right operand, so no
/// copy is needed.
pub struct LinearWeight {
    w: Vec<f32>,
    bias: Option<Vec<f32>>,
    out_features: usize,
    in_features: usize,
}

impl LinearWeight {
    pub fn new(w: &[f32], out_features: usize, in_features: usize, bias: Option<&[f32]>) -> Self {
        assert_eq!(w.len(), out_features * in_features, "linear weight size");
        if let Some(b) = bias {
            assert_eq!(b.len(), out_features, "linear bias size");
        }
        LinearWeight {
            w: w.to_vec(),
            bias: bias.map(<[f32]>::to_vec),
            out_features,
            in_features,
        }
    }

    pub fn forward(&self, x: &[f32], rows: usize, y: &mut [f32], par: gemm::Parallelism) {
        let (n, k) = (self.out_features, self.in_features);
        assert_eq!(x.len(), rows * k, "linear input size");
        assert_eq!(y.len(), rows * n, "linear output size");
        let accumulate = match &self.bias {
            Some(b) => {
                for row in y.chunks_exact_mut(n) {
                    row.copy_from_slice(b);
                }
                true
            }
            None => false,
        };
        matmul(
            MatMut::new(y, rows, n, n as isize, 1),
            MatRef::new(x, 0, rows, k, k as isize, 1),
            MatRef::new(&self.w, 0, k, n, 1, k as isize),
            accumulate,
            par,
        );
    }
}
