//! Memory-mapped `safetensors` files with tensors read as `f32` (F32, F16 and BF16 are accepted).
//!
//! The mapping serves the load only. The embedding rows read while speaking are read from the open file
//! ([`EmbeddingTable::InFile`]) with `pread`, after checking the file is still the one loaded: a model file
//! rewritten in place while the daemon runs (a package upgrade, a `cp` over it) then gives an error value,
//! where reading a mapping of a truncated file would end the process with SIGBUS.

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
        Ok(EmbeddingTable::InFile {
            file: self.source.clone(),
            offset: (self.data_start + info.data_offsets.0) as u64,
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

/// An open model file and what it was when loaded, to tell whether it is still that file.
pub struct SourceFile {
    path: PathBuf,
    file: std::fs::File,
    /// (size, modification time) when opened.
    stamp: (u64, Option<std::time::SystemTime>),
}

impl SourceFile {
    fn open(path: &Path, file: std::fs::File) -> Result<Self> {
        let meta = file.metadata().map_err(|e| Error::io(path, e))?;
        Ok(SourceFile {
            path: path.to_owned(),
            file,
            stamp: (meta.len(), meta.modified().ok()),
        })
    }

    /// Whether the open file was rewritten since it was loaded (size or modification time changed). A file
    /// replaced by a rename (a new file at the path) does not change the open one.
    pub fn changed(&self) -> bool {
        self.file
            .metadata()
            .map_or(true, |m| (m.len(), m.modified().ok()) != self.stamp)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let changed = || Error::Weights {
            path: self.path.clone(),
            message:
                "the file was rewritten while the model was in use; the model must be loaded again"
                    .into(),
        };
        if self.changed() {
            return Err(changed());
        }
        self.file.read_exact_at(buf, offset).map_err(|_| changed())
    }
}

/// An embedding table: converted in memory, or rows read from the model file when asked for.
pub enum EmbeddingTable {
    Dense {
        data: Vec<f32>,
        rows: usize,
        cols: usize,
    },
    InFile {
        file: Arc<SourceFile>,
        offset: u64,
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
            | EmbeddingTable::InFile { rows, .. }
            | EmbeddingTable::Random { rows, .. } => *rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            EmbeddingTable::Dense { cols, .. }
            | EmbeddingTable::InFile { cols, .. }
            | EmbeddingTable::Random { cols, .. } => *cols,
        }
    }

    /// Appends row `index` to `out`; the caller has checked `index < rows`. Fails only for a table read from
    /// a model file that was rewritten since it was loaded.
    pub fn push_row(&self, index: usize, out: &mut Vec<f32>) -> Result<()> {
        assert!(index < self.rows(), "embedding row {index} out of range");
        match self {
            EmbeddingTable::Dense { data, cols, .. } => {
                out.extend_from_slice(&data[index * cols..][..*cols])
            }
            EmbeddingTable::InFile {
                file,
                offset,
                element,
                cols,
                ..
            } => {
                let row_bytes = cols * element.size();
                let mut bytes = vec![0u8; row_bytes];
                file.read_at(&mut bytes, offset + (index * row_bytes) as u64)?;
                convert(*element, &bytes, out);
            }
            EmbeddingTable::Random {
                seed, name, cols, ..
            } => {
                crate::random_weights::RandomWeights::embedding_row(*seed, name, index, *cols, out)
            }
        }
        Ok(())
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
    /// The same file, for the embedding rows read while speaking.
    source: Arc<SourceFile>,
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
            source: Arc::new(SourceFile::open(path, file)?),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file holding one F32 `[rows, cols]` table `e` of row-number values.
    fn table_file(path: &Path, rows: usize, cols: usize) {
        let data: Vec<u8> = (0..rows * cols)
            .flat_map(|i| ((i / cols) as f32).to_le_bytes())
            .collect();
        let view =
            safetensors::tensor::TensorView::new(Dtype::F32, vec![rows, cols], &data).unwrap();
        safetensors::serialize_to_file([("e", view)], None, path).unwrap();
    }

    #[test]
    fn rows_of_a_file_rewritten_in_use_are_an_error_not_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        table_file(&path, 64, 256);
        let file = WeightFile::open(&path).unwrap();
        let table = Weights::embedding_table(&file, "e", 64, 256).unwrap();
        drop(file);
        let mut row = Vec::new();
        table.push_row(63, &mut row).unwrap();
        assert_eq!(row, vec![63.0; 256]);
        // Truncated in place (as `cp` over it does first): a mapping would be SIGBUS here.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(100)
            .unwrap();
        let e = table.push_row(63, &mut row).unwrap_err().to_string();
        assert!(e.contains("rewritten while the model was in use"), "{e}");
        // Rewritten to the same size: still not the file that was loaded.
        table_file(&path, 64, 256);
        assert!(table.push_row(1, &mut row).is_err());
    }

    #[test]
    fn a_file_replaced_by_rename_keeps_serving_the_loaded_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        table_file(&path, 8, 16);
        let table =
            Weights::embedding_table(&WeightFile::open(&path).unwrap(), "e", 8, 16).unwrap();
        let new = dir.path().join("new.safetensors");
        table_file(&new, 4, 16);
        std::fs::rename(&new, &path).unwrap();
        let mut row = Vec::new();
        table.push_row(7, &mut row).unwrap();
        assert_eq!(row, vec![7.0; 16]);
    }
}
