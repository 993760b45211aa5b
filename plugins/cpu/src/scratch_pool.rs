//! The buffers of a list's intermediate results ([`crate::records::each_op`]), kept between lists per thread.
//!
//! A decoder chunk's list makes and drops megabytes of intermediate results (the vocoder's last block: 96
//! channels × 24 000 values a second, several alive at once). Allocated afresh, each came zeroed from the
//! allocator or as new pages from the kernel, which zeroes them too (`memset` and `clear_page` together ~5 %
//! of the exact decoder's time, perf). The same lists run every chunk and every frame, so the buffers are kept
//! and handed out again: only a [`ZEROED`](kazeia_backend_abi::list::TensorRecord::ZEROED) tensor is cleared,
//! the others are written whole by their first op (the list's contract). Debug builds fill those with NaN
//! instead, so that a test reading a value no op wrote fails rather than passing on stale numbers.

use std::cell::RefCell;

/// Bytes of free buffers a thread keeps at most: an 8-frame decoder chunk's intermediate results fit (the
/// oldest go first beyond it).
const KEPT_BYTES: usize = 96 << 20;

#[derive(Default)]
struct Pool {
    /// Oldest first; each buffer's length is its usable size.
    free: Vec<Vec<f32>>,
    bytes: usize,
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool::default());
}

/// A buffer of at least `len` values: zeros where `zeroed`, else unspecified values (NaN in debug builds).
pub(crate) fn take(len: usize, zeroed: bool) -> Vec<f32> {
    let kept = POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        // The smallest free buffer that fits: a large one stays for a large tensor.
        let best = (pool.free.iter().enumerate())
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i)?;
        let buffer = pool.free.remove(best);
        pool.bytes -= 4 * buffer.len();
        Some(buffer)
    });
    match kept {
        Some(mut buffer) => {
            if zeroed {
                buffer[..len].fill(0.0);
            } else if cfg!(debug_assertions) {
                buffer[..len].fill(f32::NAN);
            }
            buffer
        }
        None if !zeroed && cfg!(debug_assertions) => vec![f32::NAN; len],
        None => vec![0.0; len],
    }
}

/// Keeps `buffer` for a later [`take`] on this thread (the oldest kept ones dropped past [`KEPT_BYTES`]).
pub(crate) fn give_back(buffer: Vec<f32>) {
    let bytes = 4 * buffer.len();
    if bytes == 0 || bytes > KEPT_BYTES {
        return;
    }
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        while pool.bytes + bytes > KEPT_BYTES {
            let oldest = pool.free.remove(0);
            pool.bytes -= 4 * oldest.len();
        }
        pool.bytes += bytes;
        pool.free.push(buffer);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_taken_again_and_zeroed_when_asked() {
        let mut b = take(1000, true);
        assert!(b[..1000].iter().all(|&v| v == 0.0));
        b[..1000].fill(7.0);
        let at = b.as_ptr();
        give_back(b);
        // A smaller tensor takes the same memory, cleared because it asks for zeros.
        let b = take(600, true);
        assert_eq!(b.as_ptr(), at, "the kept buffer");
        assert!(b[..600].iter().all(|&v| v == 0.0));
        give_back(b);
        // Not zeroed: whatever it held, NaN in debug builds (what the tests run).
        let b = take(600, false);
        assert_eq!(b.as_ptr(), at);
        if cfg!(debug_assertions) {
            assert!(b[..600].iter().all(|v| v.is_nan()));
        }
        give_back(b);
        // Larger than anything kept: a new buffer.
        let big = take(5000, true);
        assert_ne!(big.as_ptr(), at);
        assert!(big.len() >= 5000);
    }

    #[test]
    fn the_pool_keeps_at_most_its_bytes() {
        let quarter = KEPT_BYTES / 4 / 4;
        for _ in 0..6 {
            give_back(vec![0.0; quarter]);
        }
        POOL.with(|pool| {
            let pool = pool.borrow();
            assert_eq!(pool.bytes, KEPT_BYTES);
            assert_eq!(pool.free.len(), 4);
        });
        // One larger than the pool is not kept at all.
        give_back(vec![0.0; KEPT_BYTES / 4 + 1]);
        POOL.with(|pool| assert_eq!(pool.borrow().free.len(), 4));
    }
}
