//! Giving memory back while the daemon is idle: an utterance leaves its scratch (decoder buffers, op-list
//! intermediates, text and audio) freed inside the C allocator, which keeps most of it for the next one. A
//! daemon that sits idle between a screen reader's bursts should not hold that: once the queue has been quiet
//! for [`QUIET_BEFORE_TRIM`] after speech, the allocator returns its free pages to the system (glibc's
//! `malloc_trim`; measured on the real-size 0.6B model at q4_0: 881 → 803 MB resident after four utterances).
//! The next utterance faults the pages it needs back in.

use std::time::Duration;

/// How long the queue stays idle after speech before free memory is returned: longer than the pauses within a
/// screen reader's burst of messages, so that those keep their memory warm.
pub const QUIET_BEFORE_TRIM: Duration = Duration::from_secs(2);

/// Returns the allocator's free memory to the system; the resident set before and after, in bytes, where
/// the system says (Linux).
pub fn release_free_memory() -> (Option<u64>, Option<u64>) {
    let before = resident_bytes();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free memory of glibc's arenas to the system; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
    (before, resident_bytes())
}

/// This process's resident set in bytes, from `/proc/self/statm` (its second field, in pages).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: `sysconf` with a valid name has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn trimming_returns_freed_memory_and_keeps_live_memory() {
        // 16 MB freed below a block still in use: the allocator cannot give it back by shrinking its heap's top
        // (what `free` does on its own), only by trimming.
        let mut blocks: Vec<Vec<u8>> = (0..257).map(|i| vec![i as u8; 64 << 10]).collect();
        let kept = blocks.pop().unwrap();
        drop(blocks);
        let (before, after) = release_free_memory();
        let (before, after) = (before.unwrap(), after.unwrap());
        assert!(
            after + (8 << 20) < before,
            "resident {before} → {after} bytes"
        );
        assert!(kept.iter().all(|&b| b == 0), "live memory untouched");
    }
}
