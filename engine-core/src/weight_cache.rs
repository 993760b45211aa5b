//! The on-disk cache of repacked / quantised linear weights, so that a restart maps what it made last time
//! instead of converting the checkpoint again.
//!
//! One file per (checkpoint file, its size and modification time, weight storage, backend, Kazeia version)
//! under `$KAZEIA_CACHE_DIR`, else `$XDG_CACHE_HOME/kazeia/weights`, else `~/.cache/kazeia/weights`. The file
//! is a header (format, Kazeia version, which checkpoint and variant it was made from) and a list of named
//! entries, each the backend's own bytes for one layer with their CRC-32; a backend rejects bytes that do not
//! describe the layer asked for, and the layer is then converted from the checkpoint as usual. A cache that
//! cannot be read or written is simply not used.
//!
//! Crashes and power cuts leave nothing half-made in use: a file is written under a temporary name, synced, and
//! renamed into place (then the directory synced); a file whose entries fail their checksums is deleted at open
//! and made again; a temporary file is removed when its load fails or ends without saving, and one left by a
//! process that died is removed by the next save, which also removes the files of other Kazeia or format
//! versions and those made from an earlier state of the same checkpoint.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use memmap2::Mmap;

const MAGIC: &[u8; 8] = b"KZWCACHE";
/// 3: q/k/v and gate/up are one entry each (`load_stacked_linear`), named by their parts joined with `+`.
/// 4: Q8_0/Q4_0 block scales are rounded to halves where they are normal halves (ggml's rule), which the x86
/// kernel then streams at 2 bytes a block: a cache made before would keep every weight on 4-byte scales.
const FORMAT_VERSION: u32 = 4;
const EXTENSION: &str = "kzw";

/// Offset and length of each entry's bytes in a cache file.
pub type Index = HashMap<String, (usize, usize)>;

pub struct WeightCache {
    path: Option<PathBuf>,
    /// Hash of (checkpoint path, variant): files of the same lineage but another key are out of date.
    lineage: u64,
    mmap: Option<Mmap>,
    index: Index,
    /// `put` stores nothing (a partial load that must not leave a partial file).
    read_only: bool,
    /// New entries go straight to a temporary file (nothing is held in memory), renamed into place by `save`.
    writer: Mutex<Option<Writer>>,
}

struct Writer {
    tmp: PathBuf,
    file: std::io::BufWriter<std::fs::File>,
    count: u32,
    failed: bool,
}

pub(crate) fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("KAZEIA_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("kazeia/weights")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/kazeia/weights")))
}

fn hash_of(value: impl Hash) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// The fixed header: magic, format version, this Kazeia's version, lineage, entry count (filled in last).
fn header(lineage: u64, count: u32) -> Vec<u8> {
    let version = env!("CARGO_PKG_VERSION").as_bytes();
    let mut h = Vec::with_capacity(32 + version.len());
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    h.extend_from_slice(&(version.len() as u32).to_le_bytes());
    h.extend_from_slice(version);
    h.extend_from_slice(&lineage.to_le_bytes());
    h.extend_from_slice(&count.to_le_bytes());
    h
}

impl WeightCache {
    /// A cache that stores nothing.
    pub fn disabled() -> Self {
        WeightCache {
            path: None,
            lineage: 0,
            mmap: None,
            index: HashMap::new(),
            read_only: false,
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

    /// The cache for `checkpoint` converted as `variant`, in `dir`. Its entries are checked here: a file that
    /// fails is deleted (the load then converts and writes it again).
    pub fn open_in(dir: &Path, checkpoint: &Path, variant: &str) -> Self {
        let Ok(meta) = std::fs::metadata(checkpoint) else {
            return Self::disabled();
        };
        let canonical = checkpoint
            .canonicalize()
            .unwrap_or_else(|_| checkpoint.to_owned());
        let lineage = hash_of((&canonical, variant));
        let key = hash_of((
            &canonical,
            meta.len(),
            meta.modified().ok(),
            variant,
            env!("CARGO_PKG_VERSION"),
            FORMAT_VERSION,
        ));
        let path = dir.join(format!("{key:016x}.{EXTENSION}"));
        let mut cache = Self::disabled();
        cache.path = Some(path.clone());
        cache.lineage = lineage;
        if let Ok(f) = std::fs::File::open(&path) {
            // SAFETY: a file this cache wrote and renamed into place whole; entries are checked, then copied out.
            let mapped = unsafe { Mmap::map(&f) }.ok();
            match mapped
                .as_deref()
                .and_then(|m| parse_index(m, Some(lineage)))
            {
                Some(index) => {
                    cache.mmap = mapped;
                    cache.index = index;
                }
                None => {
                    // Damaged (a disk error, a copy cut short): made again by this load.
                    tracing::warn!(
                        "the weight cache {} is damaged; converting again",
                        path.display()
                    );
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        cache
    }

    /// This cache, taking nothing new: for loads of part of a model, whose file would lack the rest.
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
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

    /// Whether [`WeightCache::put`] keeps what it is given (a cache directory, nothing found there, not read-only):
    /// otherwise converted layers need not be exported at all.
    pub fn takes_entries(&self) -> bool {
        self.path.is_some() && !self.is_warm() && !self.read_only
    }

    pub fn put(&self, name: &str, bytes: Vec<u8>) {
        let Some(path) = &self.path else { return };
        if !self.takes_entries() {
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
                    file.write_all(&header(self.lineage, 0))?;
                    Ok(file)
                });
            match opened {
                Ok(file) => {
                    *guard = Some(Writer {
                        tmp,
                        file,
                        count: 0,
                        failed: false,
                    })
                }
                Err(_) => {
                    let _ = std::fs::remove_file(&tmp);
                    return;
                }
            }
        }
        let w = guard.as_mut().expect("writer just opened");
        if w.failed {
            return;
        }
        let result = (|| -> std::io::Result<()> {
            w.file.write_all(&(name.len() as u32).to_le_bytes())?;
            w.file.write_all(name.as_bytes())?;
            w.file.write_all(&(bytes.len() as u64).to_le_bytes())?;
            w.file.write_all(&crc32fast::hash(&bytes).to_le_bytes())?;
            w.file.write_all(&bytes)
        })();
        match result {
            Ok(()) => w.count += 1,
            Err(_) => w.failed = true,
        }
    }

    /// Completes the file of the entries made during this load and puts it in place (synced first, so a crash
    /// leaves either the old state or the whole new file); then removes what is out of date in the directory.
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
            let count_at = header(self.lineage, 0).len() - 4;
            w.file.seek(SeekFrom::Start(count_at as u64))?;
            w.file.write_all(&w.count.to_le_bytes())?;
            w.file.flush()?;
            w.file.get_ref().sync_all()?;
            std::fs::rename(&w.tmp, path)?;
            if let Some(dir) = path.parent() {
                // The rename itself reaches the disk with the directory.
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        })();
        if finish.is_err() {
            let _ = std::fs::remove_file(&w.tmp);
        } else if let Some(dir) = path.parent() {
            remove_out_of_date(dir, path, self.lineage);
        }
        finish
    }
}

impl Drop for WeightCache {
    /// A load that failed or never saved leaves no temporary file behind.
    fn drop(&mut self) {
        if let Some(w) = self
            .writer
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            drop(w.file);
            let _ = std::fs::remove_file(&w.tmp);
        }
    }
}

/// Whether process `pid` is alive (a temporary file of a live process is being written).
fn process_alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// Removes, in `dir`: temporary files of processes that are gone, cache files of other Kazeia or format
/// versions or unreadable, and other files of the same checkpoint and variant (made before the checkpoint
/// changed). `current` stays.
fn remove_out_of_date(dir: &Path, current: &Path, lineage: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path == current {
            continue;
        }
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        if let Some(owner) = ext.strip_prefix("tmp") {
            let pid = owner.split('-').next().and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|pid| !process_alive(pid)) {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        if ext != EXTENSION {
            continue;
        }
        let stale = match read_header(&path) {
            Some(h) => {
                h.format != FORMAT_VERSION
                    || h.version != env!("CARGO_PKG_VERSION")
                    || h.lineage == lineage
            }
            None => true,
        };
        if stale {
            let _ = std::fs::remove_file(&path);
        }
    }
}

struct Header {
    format: u32,
    version: String,
    lineage: u64,
    count: u32,
    /// Bytes of the header.
    len: usize,
}

/// Reads a cache file's header (a file of format version 1 has no version string: it reads as unreadable).
fn read_header(path: &Path) -> Option<Header> {
    use std::io::Read;
    let mut bytes = Vec::with_capacity(512);
    std::fs::File::open(path)
        .ok()?
        .take(512)
        .read_to_end(&mut bytes)
        .ok()?;
    parse_header(&bytes)
}

/// A little-endian reader over a byte slice that refuses to read past its end.
struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<(usize, &'a [u8])> {
        let start = self.pos;
        let end = start.checked_add(n).filter(|&e| e <= self.data.len())?;
        self.pos = end;
        Some((start, &self.data[start..end]))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.1.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.1.try_into().ok()?))
    }
}

fn parse_header(data: &[u8]) -> Option<Header> {
    let mut r = Reader { data, pos: 0 };
    if r.take(8)?.1 != MAGIC {
        return None;
    }
    let format = r.u32()?;
    if format != FORMAT_VERSION {
        return Some(Header {
            format,
            version: String::new(),
            lineage: 0,
            count: 0,
            len: r.pos,
        });
    }
    let version_len = r.u32()? as usize;
    if version_len > 64 {
        return None;
    }
    let version = String::from_utf8(r.take(version_len)?.1.to_vec()).ok()?;
    let lineage = r.u64()?;
    let count = r.u32()?;
    Some(Header {
        format,
        version,
        lineage,
        count,
        len: r.pos,
    })
}

/// The entries of a cache file's bytes, each checked against its CRC-32; `None` if anything is wrong: another
/// format or Kazeia version, another lineage (when `lineage` is given), a length past the end, a bad checksum,
/// a name twice, or bytes after the last entry.
pub fn parse_index(data: &[u8], lineage: Option<u64>) -> Option<Index> {
    let header = parse_header(data)?;
    if header.format != FORMAT_VERSION
        || header.version != env!("CARGO_PKG_VERSION")
        || lineage.is_some_and(|l| l != header.lineage)
    {
        return None;
    }
    let mut r = Reader {
        data,
        pos: header.len,
    };
    let mut index = HashMap::new();
    for _ in 0..header.count {
        let name_len = r.u32()? as usize;
        let name = String::from_utf8(r.take(name_len)?.1.to_vec()).ok()?;
        let len = usize::try_from(r.u64()?).ok()?;
        let crc = r.u32()?;
        let (start, bytes) = r.take(len)?;
        if crc32fast::hash(bytes) != crc || index.insert(name, (start, len)).is_some() {
            return None;
        }
    }
    (r.pos == data.len()).then_some(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint file and a cache directory in a fresh temporary directory.
    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let checkpoint = tmp.path().join("model.safetensors");
        std::fs::write(&checkpoint, b"weights").unwrap();
        let dir = tmp.path().join("cache");
        (tmp, checkpoint, dir)
    }

    fn write_cache(dir: &Path, checkpoint: &Path, entries: &[(&str, &[u8])]) -> PathBuf {
        let cache = WeightCache::open_in(dir, checkpoint, "q4_0:cpu:cpu");
        assert!(!cache.is_warm());
        for (name, bytes) in entries {
            cache.put(name, bytes.to_vec());
        }
        cache.save().unwrap();
        cache.path().unwrap().to_owned()
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn entries_come_back_after_a_save() {
        let (_tmp, checkpoint, dir) = setup();
        let path = write_cache(&dir, &checkpoint, &[("a", b"0123"), ("b", b"")]);
        let cache = WeightCache::open_in(&dir, &checkpoint, "q4_0:cpu:cpu");
        assert!(cache.is_warm());
        assert_eq!(cache.get("a"), Some(&b"0123"[..]));
        assert_eq!(cache.get("b"), Some(&b""[..]));
        assert_eq!(cache.get("c"), None);
        // Only the cache file: no temporary file is left.
        assert_eq!(files(&dir), [path.file_name().unwrap().to_string_lossy()]);
    }

    #[test]
    fn only_a_cold_writable_cache_takes_entries() {
        let (_tmp, checkpoint, dir) = setup();
        assert!(!WeightCache::disabled().takes_entries());
        let cold = WeightCache::open_in(&dir, &checkpoint, "q4_0:cpu:cpu");
        assert!(cold.takes_entries());
        assert!(!cold.read_only().takes_entries());
        write_cache(&dir, &checkpoint, &[("a", b"0123")]);
        assert!(!WeightCache::open_in(&dir, &checkpoint, "q4_0:cpu:cpu").takes_entries());
    }

    #[test]
    fn a_corrupted_entry_is_refused_and_its_file_deleted() {
        let (_tmp, checkpoint, dir) = setup();
        let path = write_cache(&dir, &checkpoint, &[("layer", &[7u8; 100])]);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.len() - 10;
        bytes[at] ^= 0x40; // one bit of the entry's bytes, as a disk error would
        std::fs::write(&path, &bytes).unwrap();
        let cache = WeightCache::open_in(&dir, &checkpoint, "q4_0:cpu:cpu");
        assert!(!cache.is_warm());
        assert_eq!(cache.get("layer"), None);
        assert!(!path.exists(), "the damaged file is removed");
        // The load that follows writes it again.
        cache.put("layer", vec![7u8; 100]);
        cache.save().unwrap();
        let again = WeightCache::open_in(&dir, &checkpoint, "q4_0:cpu:cpu");
        assert_eq!(again.get("layer"), Some(&[7u8; 100][..]));
    }

    #[test]
    fn a_truncated_file_is_refused() {
        let (_tmp, checkpoint, dir) = setup();
        let path = write_cache(&dir, &checkpoint, &[("a", &[1u8; 64]), ("b", &[2u8; 64])]);
        let bytes = std::fs::read(&path).unwrap();
        for cut in [0, 8, 20, bytes.len() / 2, bytes.len() - 1] {
            assert!(parse_index(&bytes[..cut], None).is_none(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(parse_index(&longer, None).is_none());
        assert!(parse_index(&bytes, None).is_some());
    }

    #[test]
    fn a_load_that_never_saves_leaves_no_temporary_file() {
        let (_tmp, checkpoint, dir) = setup();
        {
            let cache = WeightCache::open_in(&dir, &checkpoint, "q4_0:cpu:cpu");
            cache.put("a", vec![1, 2, 3]);
            assert_eq!(files(&dir).len(), 1, "the temporary file is being written");
        }
        assert!(files(&dir).is_empty(), "{:?}", files(&dir));
        // A read-only cache (a one-stage load) writes nothing at all.
        let cache = WeightCache::open_in(&dir, &checkpoint, "q4_0:cpu:cpu").read_only();
        cache.put("a", vec![1, 2, 3]);
        cache.save().unwrap();
        assert!(files(&dir).is_empty());
    }

    #[test]
    fn a_save_removes_out_of_date_files_and_dead_temporary_files() {
        let (_tmp, checkpoint, dir) = setup();
        let old = write_cache(&dir, &checkpoint, &[("a", b"old")]);
        // Another variant of the same checkpoint stays; files of another format, of a dead writer, and
        // unreadable ones go; a live writer's temporary file stays.
        let other_variant = {
            let c = WeightCache::open_in(&dir, &checkpoint, "q8_0:cpu:cpu");
            c.put("a", b"q8".to_vec());
            c.save().unwrap();
            c.path().unwrap().to_owned()
        };
        let mut v1 = MAGIC.to_vec();
        v1.extend_from_slice(&1u32.to_le_bytes());
        v1.extend_from_slice(&0u32.to_le_bytes());
        std::fs::write(dir.join("00000000000000aa.kzw"), &v1).unwrap();
        std::fs::write(dir.join("00000000000000bb.kzw"), b"garbage").unwrap();
        std::fs::write(dir.join("00000000000000cc.tmp999999999-0"), b"dead").unwrap();
        let live = format!("00000000000000dd.tmp{}-7", std::process::id());
        std::fs::write(dir.join(&live), b"live").unwrap();
        // The checkpoint changes: the next load makes a new file and the old one goes.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&checkpoint, b"new weights").unwrap();
        let new = write_cache(&dir, &checkpoint, &[("a", b"new")]);
        assert_ne!(new, old);
        let mut want = vec![
            new.file_name().unwrap().to_string_lossy().into_owned(),
            other_variant
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned(),
            live,
        ];
        want.sort();
        assert_eq!(files(&dir), want);
    }
}
