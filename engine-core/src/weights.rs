//! Memory-mapped `safetensors` files with tensors read as `f32` (F32, F16 and BF16 are accepted).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::tensor::Metadata;
use safetensors::{Dtype, SafeTensors};

use kazeia_backend_abi::WeightFormat;

use crate::error::{Error, Result};

/// Where model code gets its tensors: a released `safetensors` file, or generated random weights of the real
/// shapes for benchmarks.
pub trait Weights {
    /// Tensor `name` as `f32`, checked to have `shape`.
    fn tensor_shaped(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>>;

    /// Previously converted bytes of linear layer `name` (see [`crate::weight_cache`]).
    fn cached_linear(&self, _name: &str) -> Option<&[u8]> {
        None
    }

    /// Offers the converted bytes of linear layer `name` to the cache.
    fn store_linear(&self, _name: &str, _bytes: Vec<u8>) {}

    /// Whether [`Weights::store_linear`] keeps anything: if not, converted layers are not exported (a copy of
    /// each, made and freed during the load, which left the heap fragmented).
    fn stores_linear(&self) -> bool {
        false
    }

    /// The backend has copied cached layer `name`; its bytes may leave memory.
    fn release_cached(&self, _name: &str) {}

    /// The precision tensor `name` is stored in (what keeping it "as stored" means); F32 by default.
    fn stored_format(&self, _name: &str) -> WeightFormat {
        WeightFormat::F32
    }

    /// A `[rows, cols]` table whose rows are read on demand (the 151936-row text embedding would take 1.2 GB
    /// as `f32`; a prompt needs a few dozen rows of it).
    fn embedding_table(&self, name: &str, rows: usize, cols: usize) -> Result<EmbeddingTable> {
        Ok(EmbeddingTable::Dense {
            data: self.tensor_shaped(name, &[rows, cols])?,
            rows,
            cols,
        })
    }
}

impl Weights for WeightFile {
    fn tensor_shaped(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        WeightFile::tensor_shaped(self, name, shape)
    }

    fn stored_format(&self, name: &str) -> WeightFormat {
        match self.metadata.info(name).map(|i| i.dtype) {
            Some(Dtype::BF16) => WeightFormat::BF16,
            Some(Dtype::F16) => WeightFormat::F16,
            _ => WeightFormat::F32,
        }
    }

    fn embedding_table(&self, name: &str, rows: usize, cols: usize) -> Result<EmbeddingTable> {
        let info = self
            .metadata
            .info(name)
            .ok_or_else(|| self.error(format!("missing tensor `{name}`")))?;
        if info.shape != [rows, cols] {
            return Err(self.error(format!(
                "tensor `{name}` has shape {:?}; the config implies {:?}",
                info.shape,
                [rows, cols]
            )));
        }
        let element = self.element_type(name, info.dtype)?;
        Ok(EmbeddingTable::Mapped {
            mmap: self.mmap.clone(),
            offset: self.data_start + info.data_offsets.0,
            element,
            rows,
            cols,
        })
    }
}

#[derive(Clone, Copy, Debug)]
pub enum ElementType {
    F32,
    F16,
    BF16,
}

impl ElementType {
    fn size(self) -> usize {
        match self {
            ElementType::F32 => 4,
            _ => 2,
        }
    }
}

fn convert(element: ElementType, bytes: &[u8], out: &mut Vec<f32>) {
    match element {
        ElementType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        ElementType::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        ElementType::BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
    }
}

/// An embedding table: converted in memory, or rows read from the mapped file when asked for.
pub enum EmbeddingTable {
    Dense {
        data: Vec<f32>,
        rows: usize,
        cols: usize,
    },
    Mapped {
        mmap: Arc<Mmap>,
        offset: usize,
        element: ElementType,
        rows: usize,
        cols: usize,
    },
    /// Rows of [`crate::random_weights::RandomWeights`], generated when read.
    Random {
        seed: u64,
        name: String,
        rows: usize,
        cols: usize,
    },
}

impl EmbeddingTable {
    pub fn rows(&self) -> usize {
        match self {
            EmbeddingTable::Dense { rows, .. }
            | EmbeddingTable::Mapped { rows, .. }
            | EmbeddingTable::Random { rows, .. } => *rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            EmbeddingTable::Dense { cols, .. }
            | EmbeddingTable::Mapped { cols, .. }
            | EmbeddingTable::Random { cols, .. } => *cols,
        }
    }

    /// Appends row `index` to `out`; the caller has checked `index < rows`.
    pub fn push_row(&self, index: usize, out: &mut Vec<f32>) {
        assert!(index < self.rows(), "embedding row {index} out of range");
        match self {
            EmbeddingTable::Dense { data, cols, .. } => {
                out.extend_from_slice(&data[index * cols..][..*cols])
            }
            EmbeddingTable::Mapped {
                mmap,
                offset,
                element,
                cols,
                ..
            } => {
                let row_bytes = cols * element.size();
                let start = offset + index * row_bytes;
                convert(*element, &mmap[start..start + row_bytes], out);
            }
            EmbeddingTable::Random {
                seed, name, cols, ..
            } => {
                crate::random_weights::RandomWeights::embedding_row(*seed, name, index, *cols, out)
            }
        }
    }
}

/// A checkpoint with an on-disk cache of converted linear layers in front of it.
pub struct CachedWeights<'a> {
    pub file: &'a WeightFile,
    pub cache: crate::weight_cache::WeightCache,
}

impl Weights for CachedWeights<'_> {
    fn tensor_shaped(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.file.tensor_shaped(name, shape)
    }

    fn stored_format(&self, name: &str) -> WeightFormat {
        Weights::stored_format(self.file, name)
    }

    fn embedding_table(&self, name: &str, rows: usize, cols: usize) -> Result<EmbeddingTable> {
        Weights::embedding_table(self.file, name, rows, cols)
    }

    fn cached_linear(&self, name: &str) -> Option<&[u8]> {
        self.cache.get(name)
    }

    fn store_linear(&self, name: &str, bytes: Vec<u8>) {
        self.cache.put(name, bytes)
    }

    fn stores_linear(&self) -> bool {
        self.cache.takes_entries()
    }

    fn release_cached(&self, name: &str) {
        self.cache.release(name)
    }
}

/// One tensor converted to `f32`, with its shape.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// An open, validated `safetensors` file.
pub struct WeightFile {
    path: PathBuf,
    mmap: Arc<Mmap>,
    /// Start of the data section (after the 8-byte length and the JSON header).
    data_start: usize,
    metadata: Metadata,
}

/// Checks a `safetensors` file's bytes: its header, and every tensor's offsets against the data and its dtype
/// and shape. Returns the header's length and the metadata.
pub fn check_header(bytes: &[u8]) -> std::result::Result<(usize, Metadata), String> {
    // `deserialize` checks every offset against the file length (truncated files fail here).
    SafeTensors::deserialize(bytes).map_err(|e| e.to_string())?;
    SafeTensors::read_metadata(bytes).map_err(|e| e.to_string())
}

impl WeightFile {
    /// Maps the file and validates its header (offsets, sizes), so later reads cannot fail on truncation.
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the model files are read-only inputs; a concurrent truncation by another process is outside
        // what any model loader can defend against.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let (header_len, metadata) = check_header(&mmap).map_err(|message| Error::Weights {
            path: path.to_owned(),
            message,
        })?;
        Ok(WeightFile {
            path: path.to_owned(),
            mmap: Arc::new(mmap),
            data_start: 8 + header_len,
            metadata,
        })
    }

    fn error(&self, message: String) -> Error {
        Error::Weights {
            path: self.path.clone(),
            message,
        }
    }

    /// Drops the mapped pages of a converted tensor from memory, so that loading a model does not keep the
    /// whole file resident next to its converted weights (the pages come back from the file if read again).
    fn release(&self, offset: usize, len: usize) {
        #[cfg(unix)]
        // SAFETY: the mapping is a read-only view of a file; MADV_DONTNEED only discards clean page-cache
        // pages of this mapping, which are re-read from the file on the next access. No slice into them is
        // alive here (the tensor was copied out).
        unsafe {
            let _ =
                self.mmap
                    .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len);
        }
        #[cfg(not(unix))]
        let _ = (offset, len);
    }

    fn element_type(&self, name: &str, dtype: Dtype) -> Result<ElementType> {
        match dtype {
            Dtype::F32 => Ok(ElementType::F32),
            Dtype::F16 => Ok(ElementType::F16),
            Dtype::BF16 => Ok(ElementType::BF16),
            other => Err(self.error(format!(
                "tensor `{name}` has dtype {other:?}; expected F32, F16 or BF16"
            ))),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn contains(&self, name: &str) -> bool {
        self.metadata.info(name).is_some()
    }

    /// Reads tensor `name` as `f32`.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let info = self
            .metadata
            .info(name)
            .ok_or_else(|| self.error(format!("missing tensor `{name}`")))?;
        let (start, end) = info.data_offsets;
        let bytes = &self.mmap[self.data_start + start..self.data_start + end];
        let element = self.element_type(name, info.dtype)?;
        let mut data = Vec::with_capacity(bytes.len() / element.size());
        convert(element, bytes, &mut data);
        self.release(self.data_start + start, end - start);
        Ok(Tensor {
            shape: info.shape.clone(),
            data,
        })
    }

    /// Reads tensor `name` and checks that its shape is `shape`.
    pub fn tensor_shaped(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = self.tensor(name)?;
        if t.shape != shape {
            return Err(self.error(format!(
                "tensor `{name}` has shape {:?}; the config implies {shape:?}",
                t.shape
            )));
        }
        Ok(t.data)
    }
}
