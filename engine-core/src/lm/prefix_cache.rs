//! The talker's KV rows for prompt prefixes that recur. Every prompt of a voice starts with the same rows — the
//! role (`<|im_start|>assistant\n`), the think/language tags, the speaker (or a cloned voice's x-vector), an
//! instruction, a cloned voice's reference transcript — and only then comes the text (see `prompt.rs`). A
//! causal transformer's keys and values for a prefix do not depend on what follows, so those rows are run once
//! per voice and their keys and values copied into each new generation's cache: the prefill then runs only the
//! rows of the text.
//!
//! A prompt's prefix rows always run as one batch, whether they come from here or not, so a generation gives the
//! same result the first time and every time after. Entries are keyed by the prefix rows themselves (compared
//! bit for bit): a new speaker, language or instruction is a new entry, and nothing can be confused. The cache
//! keeps the most recently used entries within a count and a byte bound, a set share of the machine's memory;
//! an entry larger than that bound alone (a request's outsized prompt prefix) is never kept: its generation
//! uses the rows it ran and they go with it.

use std::sync::{Arc, Mutex};

use super::transformer::KvPrefix;

/// Entries kept at most (voices × languages in use at once; a screen reader uses one or two).
const MAX_ENTRIES: usize = 8;
/// Bytes of keys and values kept at most (a built-in voice's 9 rows are ~2 MiB on the released models; an
/// in-context cloned voice's rows with its transcript some more)…
const MAX_BYTES: usize = 64 << 20;
/// …and never more than this share of the machine's memory (16 MiB on a 1 GiB board).
const MEMORY_SHARE: usize = 64;

/// The cache's byte bound on this machine.
fn byte_bound() -> usize {
    // SAFETY: sysconf takes and returns integers only.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || page <= 0 {
        return MAX_BYTES;
    }
    MAX_BYTES.min((pages as usize).saturating_mul(page as usize) / MEMORY_SHARE)
}

struct Entry {
    /// The prefix rows, `[rows][hidden]`, as the prompt had them.
    rows: Vec<f32>,
    kv: Arc<KvPrefix>,
}

/// Most recently used first.
pub struct PrefixCache {
    entries: Mutex<Vec<Entry>>,
    max_bytes: usize,
}

impl Default for PrefixCache {
    fn default() -> Self {
        PrefixCache::with_bound(byte_bound())
    }
}

impl PrefixCache {
    /// A cache that keeps at most `max_bytes`.
    pub fn with_bound(max_bytes: usize) -> Self {
        PrefixCache {
            entries: Mutex::new(Vec::new()),
            max_bytes,
        }
    }

    /// Bytes kept at most; no entry larger is kept.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// The keys and values stored for exactly these prefix rows, if any.
    pub fn get(&self, rows: &[f32]) -> Option<Arc<KvPrefix>> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let at = entries.iter().position(|e| same_bits(&e.rows, rows))?;
        let entry = entries.remove(at);
        let kv = entry.kv.clone();
        entries.insert(0, entry);
        Some(kv)
    }

    /// Keeps `kv` for these prefix rows, dropping the least recently used entries beyond the bounds; an
    /// entry over the byte bound by itself is not kept.
    pub fn insert(&self, rows: &[f32], kv: KvPrefix) {
        if kv.bytes() + rows.len() * 4 > self.max_bytes {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|e| !same_bits(&e.rows, rows));
        entries.insert(
            0,
            Entry {
                rows: rows.to_vec(),
                kv: Arc::new(kv),
            },
        );
        let mut bytes = 0;
        let mut keep = 0;
        for e in entries.iter() {
            bytes += e.kv.bytes() + e.rows.len() * 4;
            if keep == MAX_ENTRIES || bytes > self.max_bytes {
                break;
            }
            keep += 1;
        }
        entries.truncate(keep);
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every entry.
    pub fn clear(&self) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// Equal bit for bit (so `-0.0 ≠ 0.0` and a NaN equals itself: the rows are the same input, or not).
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(v: f32, n: usize) -> Vec<f32> {
        vec![v; n]
    }

    #[test]
    fn entries_are_found_by_their_rows_bit_for_bit() {
        let cache = PrefixCache::default();
        assert!(cache.get(&rows(1.0, 4)).is_none());
        cache.insert(&rows(1.0, 4), KvPrefix::zeros(2, 3, 4));
        assert_eq!(cache.get(&rows(1.0, 4)).unwrap().rows(), 3);
        assert!(cache.get(&rows(1.0, 5)).is_none(), "longer rows");
        assert!(cache.get(&rows(-0.0, 4)).is_none());
        cache.insert(&rows(0.0, 4), KvPrefix::zeros(2, 1, 4));
        assert!(cache.get(&rows(-0.0, 4)).is_none(), "-0.0 is not 0.0");
        assert_eq!(cache.get(&rows(0.0, 4)).unwrap().rows(), 1);
        // The same rows again replace their entry.
        cache.insert(&rows(0.0, 4), KvPrefix::zeros(2, 2, 4));
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(&rows(0.0, 4)).unwrap().rows(), 2);
        cache.clear();
        assert!(cache.is_empty());
    }

    #[test]
    fn the_least_recently_used_entries_go_beyond_the_bounds() {
        let cache = PrefixCache::default();
        for i in 0..MAX_ENTRIES {
            cache.insert(&rows(i as f32, 2), KvPrefix::zeros(1, 1, 2));
        }
        // Entry 0 used: entry 1 is now the oldest and goes when one more comes.
        assert!(cache.get(&rows(0.0, 2)).is_some());
        cache.insert(&rows(99.0, 2), KvPrefix::zeros(1, 1, 2));
        assert_eq!(cache.len(), MAX_ENTRIES);
        assert!(cache.get(&rows(1.0, 2)).is_none());
        assert!(cache.get(&rows(0.0, 2)).is_some());
        assert!(cache.get(&rows(2.0, 2)).is_some());

        // An entry over the byte bound by itself is never kept, and the others stay.
        let big = cache.max_bytes() / 4 / 2 + 1;
        cache.insert(&rows(70.0, 2), KvPrefix::zeros(1, 1, big));
        assert!(cache.get(&rows(70.0, 2)).is_none());
        assert_eq!(cache.len(), MAX_ENTRIES);
        // Entries that fit alone but not together: the least recently used go.
        let half = cache.max_bytes() / 4 / 2 / 2;
        cache.insert(&rows(8.0, 2), KvPrefix::zeros(1, 1, half));
        cache.insert(&rows(9.0, 2), KvPrefix::zeros(1, 1, half));
        assert_eq!(cache.len(), 1);
        assert!(cache.get(&rows(9.0, 2)).is_some());
    }

    #[test]
    fn the_bound_is_a_share_of_the_machines_memory() {
        let bound = PrefixCache::default().max_bytes();
        assert!(bound > 0 && bound <= MAX_BYTES, "{bound}");
        let small = PrefixCache::with_bound(1000);
        small.insert(&rows(1.0, 2), KvPrefix::zeros(1, 1, 200)); // 1608 bytes
        assert!(small.is_empty());
        small.insert(&rows(1.0, 2), KvPrefix::zeros(1, 1, 100)); // 808 bytes
        assert_eq!(small.len(), 1);
    }
}
