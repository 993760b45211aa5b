//! The on-disk cache of repacked / quantised linear weights, so that a restart maps what it made last time
//! instead of converting the checkpoint again.
//!
//! One file per (checkpoint file, its size and modification time, weight storage, backend, Kazeia version)
//! under `$KAZEIA_CACHE_DIR`, else `$XDG_CACHE_HOME/kazeia/weights`, else `~/.cache/kazeia/weights`. The file
//! is a list of named entries, each the backend's own bytes for one layer; a backend rejects bytes that do not
//! describe the layer asked for, and the layer is then converted from the checkpoint as usual. A cache that
//! cannot be read or written is simply not used.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use memmap2::Mmap;

const MAGIC: &[u8; 8] = b"KZWCACHE";
const FORMAT_VERSION: u32 = 1;

pub struct WeightCache {
    path: Option<PathBuf>,
    mmap: Option<Mmap>,
    index: HashMap<String, (usize, usize)>,
    /// New entries go straight to a temporary file (nothing is held in memory), renamed into place by `save`.
    writer: Mutex<Option<Writer>>,
}

struct Writer {
    tmp: PathBuf,
    file: std::io::BufWriter<std::fs::File>,
    count: u32,
    failed: bool,
}

fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("KAZEIA_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("kazeia/weights")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/kazeia/weights")))
}

impl WeightCache {
    /// A cache that stores nothing.
    pub fn disabled() -> Self {
        WeightCache {
            path: None,
            mmap: None,
            index: HashMap::new(),
            writer: Mutex::new(None),
        }
    }

    /// The cache for `checkpoint` converted as `variant` (storage and backend names), in the default directory.
    pub fn open(checkpoint: &Path, variant: &str) -> Self {
        match cache_dir() {
            Some(dir) => Self::open_in(&dir, checkpoint, variant),
            None => Self::disabled(),
        }
    }

    /// The cache for `checkpoint` converted as `variant`, in `dir`.
    pub fn open_in(dir: &Path, checkpoint: &Path, variant: &str) -> Self {
        let Ok(meta) = std::fs::metadata(checkpoint) else {
            return Self::disabled();
        };
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (
            checkpoint
                .canonicalize()
                .unwrap_or_else(|_| checkpoint.to_owned()),
            meta.len(),
            meta.modified().ok(),
            variant,
            env!("CARGO_PKG_VERSION"),
            FORMAT_VERSION,
        )
            .hash(&mut hasher);
        let path = dir.join(format!("{:016x}.kzw", hasher.finish()));
        let mut cache = WeightCache {
            path: Some(path.clone()),
            ..Self::disabled()
        };
        if let Some((mmap, index)) = std::fs::File::open(&path).ok().and_then(|f| {
            // SAFETY: a file this cache wrote and renames into place whole; entries are copied out.
            let mmap = unsafe { Mmap::map(&f) }.ok()?;
            let index = parse(&mmap)?;
            Some((mmap, index))
        }) {
            cache.mmap = Some(mmap);
            cache.index = index;
        }
        cache
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Whether entries were found on disk.
    pub fn is_warm(&self) -> bool {
        !self.index.is_empty()
    }

    pub fn get(&self, name: &str) -> Option<&[u8]> {
        let (start, len) = *self.index.get(name)?;
        self.mmap.as_ref().map(|m| &m[start..start + len])
    }

    /// Drops the mapped pages of an entry once the backend has copied it.
    pub fn release(&self, name: &str) {
        if let (Some(&(start, len)), Some(mmap)) = (self.index.get(name), &self.mmap) {
            // SAFETY: read-only file mapping; discarded pages are re-read from the file if touched again, and
            // no slice into this entry is alive once the backend copied it.
            #[cfg(unix)]
            unsafe {
                let _ = mmap.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len);
            }
            #[cfg(not(unix))]
            let _ = (start, len, mmap);
        }
    }

    pub fn put(&self, name: &str, bytes: Vec<u8>) {
        let Some(path) = &self.path else { return };
        if self.is_warm() {
            return;
        }
        let mut guard = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            // Unique per writer: loads running at once each write their own file, and the last rename wins.
            static WRITERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = WRITERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
            let opened = path
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| std::fs::File::create(&tmp))
                .and_then(|f| {
                    let mut file = std::io::BufWriter::new(f);
                    file.write_all(MAGIC)?;
                    file.write_all(&FORMAT_VERSION.to_le_bytes())?;
                    file.write_all(&0u32.to_le_bytes())?; // entry count, filled in by `save`
                    Ok(file)
                });
            let Ok(file) = opened else { return };
            *guard = Some(Writer {
                tmp,
                file,
                count: 0,
                failed: false,
            });
        }
        let w = guard.as_mut().expect("writer just opened");
        let result = (|| -> std::io::Result<()> {
            w.file.write_all(&(name.len() as u32).to_le_bytes())?;
            w.file.write_all(name.as_bytes())?;
            w.file.write_all(&(bytes.len() as u64).to_le_bytes())?;
            w.file.write_all(&bytes)
        })();
        match result {
            Ok(()) => w.count += 1,
            Err(_) => w.failed = true,
        }
    }

    /// Completes the file of the entries made during this load and puts it in place.
    pub fn save(&self) -> std::io::Result<()> {
        let (Some(path), Some(mut w)) = (
            &self.path,
            self.writer.lock().unwrap_or_else(|e| e.into_inner()).take(),
        ) else {
            return Ok(());
        };
        let finish = (|| -> std::io::Result<()> {
            if w.failed {
                return Err(std::io::Error::other("a cache entry could not be written"));
            }
            w.file.seek(SeekFrom::Start((MAGIC.len() + 4) as u64))?;
            w.file.write_all(&w.count.to_le_bytes())?;
            w.file.flush()?;
            std::fs::rename(&w.tmp, path)
        })();
        if finish.is_err() {
            let _ = std::fs::remove_file(&w.tmp);
        }
        finish
    }
}

fn parse(data: &[u8]) -> Option<HashMap<String, (usize, usize)>> {
    let mut pos: usize = 0;
    let mut take = |n: usize| -> Option<(usize, &[u8])> {
        let start = pos;
        let end = pos.checked_add(n).filter(|&e| e <= data.len())?;
        pos = end;
        Some((start, &data[start..end]))
    };
    if take(8)?.1 != MAGIC || u32::from_le_bytes(take(4)?.1.try_into().ok()?) != FORMAT_VERSION {
        return None;
    }
    let count = u32::from_le_bytes(take(4)?.1.try_into().ok()?);
    let mut index = HashMap::new();
    for _ in 0..count {
        let name_len = u32::from_le_bytes(take(4)?.1.try_into().ok()?) as usize;
        let name = String::from_utf8(take(name_len)?.1.to_vec()).ok()?;
        let len = u64::from_le_bytes(take(8)?.1.try_into().ok()?) as usize;
        let (start, _) = take(len)?;
        index.insert(name, (start, len));
    }
    Some(index)
}
