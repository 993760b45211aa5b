//! Loading a `Linear` layer (`{name}.weight`, optional `{name}.bias`) into a backend.

use kazeia_backend_abi::{Backend, Weight, WeightFormat};

use crate::error::Result;
use crate::weights::Weights;

pub fn load_linear(
    backend: &dyn Backend,
    weights: &dyn Weights,
    name: &str,
    (out, inp): (usize, usize),
    bias: bool,
    format: WeightFormat,
) -> Result<Weight> {
    let w = weights.tensor_shaped(&format!("{name}.weight"), &[out, inp])?;
    let b = if bias {
        Some(weights.tensor_shaped(&format!("{name}.bias"), &[out])?)
    } else {
        None
    };
    Ok(backend.upload_linear(&w, out, inp, b.as_deref(), format))
}
