//! Chunked loops that run on the backend's pool, or inline on the caller's thread when the work is too small
//! to be worth a hand-off (entering a pool costs microseconds; the code predictor issues ~1000 ops per frame).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rayon::prelude::*;

/// How long a helper waits for work without finding any before it leaves the list to the pool's own sleep.
const SPIN_IDLE: Duration = Duration::from_micros(200);

/// Runs `work` on the current worker of a rayon pool while `helpers` other workers spin, running the pool's
/// jobs as they appear (`rayon::yield_now`), until `work` ends or they find nothing to do for [`SPIN_IDLE`].
/// A stage's list is hundreds of short parallel ops with a few microseconds of serial ops between them: left to
/// itself, an idle rayon worker goes to sleep within that gap, and every parallel op then pays a futex wake-up
/// and a context switch (measured: ~15 % of a talker step on 2 threads).
pub fn with_spinning_helpers<R: Send>(helpers: usize, work: impl FnOnce() -> R + Send) -> R {
    let done = AtomicBool::new(false);
    rayon::scope(|s| {
        for _ in 0..helpers {
            s.spawn(|_| {
                let mut idle_since = Instant::now();
                let mut rounds = 0u32;
                while !done.load(Ordering::Acquire) {
                    if rayon::yield_now() == Some(rayon::Yield::Executed) {
                        idle_since = Instant::now();
                        continue;
                    }
                    std::hint::spin_loop();
                    rounds = rounds.wrapping_add(1);
                    if rounds.is_multiple_of(64) && idle_since.elapsed() > SPIN_IDLE {
                        return;
                    }
                }
            });
        }
        let result = work();
        done.store(true, Ordering::Release);
        result
    })
}

/// Calls `f(index, chunk)` for each `size`-long chunk of `data`, in parallel or not.
pub fn chunks_mut<T: Send>(
    parallel: bool,
    data: &mut [T],
    size: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    if parallel {
        data.par_chunks_mut(size)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    } else {
        data.chunks_mut(size).enumerate().for_each(|(i, c)| f(i, c));
    }
}
