//! A short probe of the machine's streaming read rate over a buffer of a given size: the ceiling of a stage that
//! reads all its weights once per step, so `kazeia bench` can show how close the talker and code predictor come
//! to it.
//!
//! The buffer is as large as what the stage reads per step and is read again and again as the stage's weights
//! are, so the caches hold the same share of it: the talker's hundreds of megabytes come from DRAM, a code
//! predictor step's ~50 MB stays in a large L3 (260 MB on the Xeons of these machines, where a fixed 256 MiB
//! probe read partly from L3 and its result swung with the neighbours). The reads are 32-byte vector loads where
//! the CPU has AVX2: on a Xeon a plain `u64` loop read ~25 % slower from DRAM than the same loop on 32-byte loads.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

/// Fewest passes over the buffer; more while the probe has taken under [`PROBE_TIME`].
const MIN_PASSES: usize = 6;
/// Windows of consecutive passes the rate is taken over (the best one's).
pub const WINDOWS: usize = 3;
const MAX_PASSES: usize = 60;
const PROBE_TIME: Duration = Duration::from_millis(300);

/// Streaming-read rate in GB/s (10⁹ B/s) over `threads` threads, each summing its share of one buffer of
/// `bytes` (at least 1 MiB) once per pass; the threads start together at each pass, which runs from the first
/// one's start to the last one's end. The rate is the best of [`WINDOWS`] windows of consecutive passes (each
/// window's bytes over its time), as a stage's is the fastest of whole runs: the best single pass (a few
/// milliseconds) caught quiet moments of a shared machine that no stage's loop could (on a Zen 5 VM, best passes
/// over the same 250 MB read 41 to 72 GB/s from one run to the next).
pub fn read_bandwidth_gbps(threads: usize, bytes: usize) -> f64 {
    let threads = threads.max(1);
    let words = bytes.max(1 << 20) / 8;
    // Written once, so its pages are mapped before timing.
    let buffer: Vec<u64> = (0..words as u64).collect();
    let parts: Vec<&[u64]> = buffer.chunks(words.div_ceil(threads)).collect();
    let (start, end) = (Barrier::new(parts.len() + 1), Barrier::new(parts.len() + 1));
    let stop = AtomicBool::new(false);
    // Each reader's own start and end of the pass: a pass runs from the first start to the last end. (Timed by
    // the coordinating thread, a pass would start whenever the scheduler woke it, at times after the readers.)
    let spans: Vec<Mutex<Option<(Instant, Instant)>>> =
        parts.iter().map(|_| Mutex::new(None)).collect();
    let mut passes_s = Vec::new();
    std::thread::scope(|scope| {
        for (part, span) in parts.iter().zip(&spans) {
            let (start, end, stop) = (&start, &end, &stop);
            scope.spawn(move || loop {
                start.wait();
                if stop.load(Ordering::Acquire) {
                    return;
                }
                let began = Instant::now();
                // The slice through `black_box`, so the sum is not hoisted out of the loop as a pure function of
                // an unchanging input.
                black_box(sum(black_box(part)));
                *span.lock().unwrap() = Some((began, Instant::now()));
                end.wait();
            });
        }
        let probe = Instant::now();
        let mut passes = 0;
        while passes < MIN_PASSES || (probe.elapsed() < PROBE_TIME && passes < MAX_PASSES) {
            start.wait();
            end.wait();
            let recorded: Vec<(Instant, Instant)> = spans
                .iter()
                .filter_map(|s| s.lock().unwrap().take())
                .collect();
            let first = recorded.iter().map(|s| s.0).min();
            let last = recorded.iter().map(|s| s.1).max();
            if let (Some(first), Some(last)) = (first, last) {
                passes_s.push((last - first).as_secs_f64());
            }
            passes += 1;
        }
        stop.store(true, Ordering::Release);
        start.wait();
    });
    best_window_rate(&passes_s, (words * 8) as f64) / 1e9
}

/// The best rate in bytes per second over [`WINDOWS`] runs of consecutive passes of `bytes` each (their sizes
/// differ by one pass at most).
fn best_window_rate(passes_s: &[f64], bytes: f64) -> f64 {
    let n = passes_s.len();
    (0..WINDOWS)
        .map(|w| &passes_s[w * n / WINDOWS..(w + 1) * n / WINDOWS])
        .filter(|w| !w.is_empty())
        .map(|w| w.len() as f64 * bytes / w.iter().sum::<f64>())
        .fold(0.0, f64::max)
}

/// The wrapping sum of `words`, on the widest loads this CPU has.
fn sum(words: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return unsafe { sum_avx2(words) };
    }
    sum_lanes(words)
}

/// 32 independent lanes, so the loop waits on loads, not on one chain of adds (and vectorises on any target).
#[inline(always)]
fn sum_lanes(words: &[u64]) -> u64 {
    let mut lanes = [0u64; 32];
    let mut chunks = words.chunks_exact(lanes.len());
    for chunk in &mut chunks {
        for (lane, &w) in lanes.iter_mut().zip(chunk) {
            *lane = lane.wrapping_add(w);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |a, &w| a.wrapping_add(w));
    lanes.iter().fold(tail, |a, &l| a.wrapping_add(l))
}

/// [`sum_lanes`] compiled for AVX2 (32-byte loads).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2(words: &[u64]) -> u64 {
    sum_lanes(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_word() {
        for n in [0u64, 21, 32, 77, 1000] {
            let words: Vec<u64> = (1..=n).collect();
            assert_eq!(sum(&words), n * (n + 1) / 2, "{n} words");
            assert_eq!(sum_lanes(&words), n * (n + 1) / 2, "{n} words");
        }
    }

    /// Windows of consecutive passes, the best one's bytes over its time: one fast pass does not make a window.
    #[test]
    fn the_rate_is_the_best_windows() {
        // Passes of 1 B: window rates 1/(1+1+2) · 3 = 0.75, 3/(0.5+4+1.5) = 0.5, 3/3 = 1 B/s.
        let passes = [1.0, 1.0, 2.0, 0.5, 4.0, 1.5, 1.0, 1.0, 1.0];
        assert_eq!(best_window_rate(&passes, 1.0), 1.0);
        // Seven passes: windows of 2, 2 and 3; the fast last pass is averaged with two slow ones.
        let seven = [2.0, 2.0, 4.0, 4.0, 4.0, 4.0, 0.5];
        assert_eq!(best_window_rate(&seven, 1.0), 0.5);
        assert_eq!(best_window_rate(&[], 1.0), 0.0);
    }

    #[test]
    fn a_probe_ends_with_a_rate_for_any_thread_count() {
        for threads in [1, 3] {
            let gbps = read_bandwidth_gbps(threads, 4 << 20);
            assert!(gbps.is_finite() && gbps > 0.0, "{threads} threads: {gbps}");
        }
    }
}
