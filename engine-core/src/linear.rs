//! Loading weights into a backend: any weight ([`upload`]), and a `Linear` layer (`{name}.weight`, optional
//! `{name}.bias`) with its resident format and the on-disk cache of converted weights ([`load_linear`]).

use kazeia_backend_abi::{Backend, Weight, WeightData, WeightFormat};

use crate::error::{Error, Result};
use crate::weights::Weights;

/// How linear weights stay resident: in the checkpoint's own precision (lossless: BF16 for the released
/// models), or converted to a chosen format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightStorage {
    #[default]
    AsStored,
    Convert(WeightFormat),
}

impl WeightStorage {
    /// How the codec decoder's weights (F32 in the release, 114 M of them) are held alongside an LM stored as
    /// `self`: F16 under the lossy formats (q8_0, q4_0), which trade precision for memory already — half the
    /// decoder's memory, at a waveform SNR the codec parity test bounds — and F32 otherwise (lossless).
    pub fn decoder_format(self) -> WeightFormat {
        match self {
            WeightStorage::Convert(WeightFormat::Q8_0 | WeightFormat::Q4_0) => WeightFormat::F16,
            _ => WeightFormat::F32,
        }
    }
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

/// Uploads a weight; a backend that refuses it (out of device memory, a shape it cannot hold) is an
/// [`Error::Backend`] the loader can act on (fall back to the CPU, report the model as not loaded).
pub fn upload(backend: &dyn Backend, weight: WeightData<'_>) -> Result<Weight> {
    backend.upload(weight).map_err(|message| Error::Backend {
        backend: backend.name().to_owned(),
        message: format!("cannot hold a weight: {message}"),
    })
}

/// [`upload`] of an f32 `Linear` weight `w[out][inp]`.
pub fn upload_f32_linear(
    backend: &dyn Backend,
    w: &[f32],
    out: usize,
    inp: usize,
    bias: Option<&[f32]>,
) -> Result<Weight> {
    let format = WeightFormat::F32;
    upload(
        backend,
        WeightData::Linear {
            w,
            out,
            inp,
            bias,
            format,
        },
    )
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
    let weight = upload(
        backend,
        WeightData::Linear {
            w: &w,
            out,
            inp,
            bias: b.as_deref(),
            format,
        },
    )?;
    if format != WeightFormat::F32 {
        if let Some(bytes) = backend.export_linear(&weight) {
            weights.store_linear(&weight_name, bytes);
        }
    }
    Ok(weight)
}
