//! Chunked loops that run on the backend's pool, or inline on the caller's thread when the work is too small
//! to be worth a hand-off (entering a pool costs microseconds; the code predictor issues ~1000 ops per frame).

use rayon::prelude::*;

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
