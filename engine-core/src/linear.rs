//! Loading a `Linear` layer (`{name}.weight`, optional `{name}.bias`) into a backend.

use kazeia_backend_abi::{Backend, Weight, WeightFormat};

use crate::error::Result;
use crate::weights::Weights;

/// How linear weights stay resident: in the checkpoint's own precision (lossless: BF16 for the released
/// models), or converted to a chosen format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightStorage {
    #[default]
    AsStored,
    Convert(WeightFormat),
}

impl std::str::FromStr for WeightStorage {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(WeightStorage::AsStored),
            other => other.parse().map(WeightStorage::Convert),
        }
    }
}

impl std::fmt::Display for WeightStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightStorage::AsStored => f.write_str("auto"),
            WeightStorage::Convert(format) => format.fmt(f),
        }
    }
}

pub fn load_linear(
    backend: &dyn Backend,
    weights: &dyn Weights,
    name: &str,
    (out, inp): (usize, usize),
    bias: bool,
    storage: WeightStorage,
) -> Result<Weight> {
    let weight_name = format!("{name}.weight");
    let format = match storage {
        WeightStorage::AsStored => weights.stored_format(&weight_name),
        WeightStorage::Convert(format) => format,
    };
    if let Some(bytes) = weights.cached_linear(&weight_name) {
        let imported = backend.import_linear(bytes, out, inp, format);
        weights.release_cached(&weight_name);
        if let Some(weight) = imported {
            return Ok(weight);
        }
    }
    let w = weights.tensor_shaped(&weight_name, &[out, inp])?;
    let b = if bias {
        Some(weights.tensor_shaped(&format!("{name}.bias"), &[out])?)
    } else {
        None
    };
    let weight = backend.upload_linear(&w, out, inp, b.as_deref(), format);
    if format != WeightFormat::F32 {
        if let Some(bytes) = backend.export_linear(&weight) {
            weights.store_linear(&weight_name, bytes);
        }
    }
    Ok(weight)
}
