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

/// A format's name (`bf16`, `q4_0`, …): converted to it. `auto` is not a storage but a choice made at load
/// (`crate::weights_auto::WeightsSetting`).
impl std::str::FromStr for WeightStorage {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.parse().map(WeightStorage::Convert)
    }
}

impl std::fmt::Display for WeightStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightStorage::AsStored => f.write_str("as stored"),
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
    load_stacked_linear(backend, weights, &[(name, out)], inp, bias, storage)
}

/// One linear layer whose output rows are those of the checkpoint's layers `parts` (name, output rows), in
/// order: layers that read the same input (q/k/v, gate/up) run as one op, so its input is prepared once (the
/// int8 kernels quantise it) and its threads are forked once. Each output is the same dot product as in its
/// own layer. Kept "as stored" in the parts' common format (f32 where they differ); cached under the parts'
/// names joined by `+`.
pub fn load_stacked_linear(
    backend: &dyn Backend,
    weights: &dyn Weights,
    parts: &[(&str, usize)],
    inp: usize,
    bias: bool,
    storage: WeightStorage,
) -> Result<Weight> {
    let weight_names: Vec<String> = parts.iter().map(|(n, _)| format!("{n}.weight")).collect();
    let out: usize = parts.iter().map(|&(_, o)| o).sum();
    let format = match storage {
        WeightStorage::AsStored => {
            let first = weights.stored_format(&weight_names[0]);
            if weight_names
                .iter()
                .all(|n| weights.stored_format(n) == first)
            {
                first
            } else {
                WeightFormat::F32
            }
        }
        WeightStorage::Convert(format) => format,
    };
    let cache_name = weight_names.join("+");
    if let Some(bytes) = weights.cached_linear(&cache_name) {
        let imported = backend.import_linear(bytes, out, inp, format);
        weights.release_cached(&cache_name);
        if let Some(weight) = imported {
            return Ok(weight);
        }
    }
    let mut stacked = StackedRows::new(out * inp)?;
    let mut b = Vec::new();
    let mut row = 0;
    for (&(name, part_out), weight_name) in parts.iter().zip(&weight_names) {
        let part = weights.tensor_shaped(weight_name, &[part_out, inp])?;
        stacked.as_mut_slice()[row * inp..(row + part_out) * inp].copy_from_slice(&part);
        row += part_out;
        if bias {
            b.extend(weights.tensor_shaped(&format!("{name}.bias"), &[part_out])?);
        }
    }
    let weight = upload(
        backend,
        WeightData::Linear {
            w: stacked.as_mut_slice(),
            out,
            inp,
            bias: bias.then_some(&b[..]),
            format,
        },
    )?;
    if format != WeightFormat::F32 && weights.stores_linear() {
        if let Some(bytes) = backend.export_linear(&weight) {
            weights.store_linear(&cache_name, bytes);
        }
    }
    Ok(weight)
}

/// The f32 rows of a stacked layer while it is converted, in an anonymous mapping of its own, given back to the
/// system when dropped. From the heap, the ~25 MB of a gate/up pair raised glibc's mmap threshold past every
/// later buffer of the load, which then stayed on the heap fragmented: peak RSS of 0.6B bf16 +160 MB. A layer of
/// one part goes through it too (one extra copy at load): handing the checkpoint's heap vector straight to the
/// conversion measured a peak RSS of 1660 MB against 1585 MB (0.6B bf16; q4_0 678 against 665 MB).
struct StackedRows {
    map: memmap2::MmapMut,
    len: usize,
}

impl StackedRows {
    fn new(len: usize) -> Result<Self> {
        let map = memmap2::MmapMut::map_anon((len * 4).max(1))
            .map_err(|e| crate::Error::io("anonymous memory for a stacked layer", e))?;
        Ok(StackedRows { map, len })
    }

    fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: the mapping is page-aligned (so aligned for f32), at least `len · 4` bytes, zero-filled (a valid
        // f32 bit pattern), and borrowed mutably through `self` only.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().cast::<f32>(), self.len) }
    }
}
