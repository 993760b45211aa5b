//! A short probe of the machine's streaming read bandwidth from memory: the ceiling of a stage that reads all its
//! weights once per step, so `kazeia bench` can show how close the talker and code predictor come to it.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// Bytes read per pass: 8× the 32 MiB last-level cache of the machines this runs on, so nearly every byte comes
/// from DRAM, as the weights of a step do.
pub const PROBE_BYTES: usize = 256 << 20;

/// Best streaming-read rate in GB/s (10⁹ B/s) over `threads` threads, each summing its share of a buffer of
/// [`PROBE_BYTES`]; at least 3 passes, more while the probe has taken under 0.2 s.
pub fn read_bandwidth_gbps(threads: usize) -> f64 {
    let words = PROBE_BYTES / 8;
    // Written once, so its pages are mapped before timing.
    let buffer: Vec<u64> = (0..words as u64).collect();
    let share = words.div_ceil(threads.max(1));
    let start = Instant::now();
    let mut best = Duration::MAX;
    let mut passes = 0;
    while passes < 3 || (start.elapsed() < Duration::from_millis(200) && passes < 50) {
        let pass = Instant::now();
        std::thread::scope(|scope| {
            for part in buffer.chunks(share) {
                scope.spawn(move || black_box(sum(part)));
            }
        });
        best = best.min(pass.elapsed());
        passes += 1;
    }
    PROBE_BYTES as f64 / best.as_secs_f64() / 1e9
}

/// Eight independent lanes, so the loop waits on loads, not on one chain of adds.
fn sum(words: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let mut chunks = words.chunks_exact(8);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_word() {
        let words: Vec<u64> = (1..=21).collect();
        assert_eq!(sum(&words), 21 * 22 / 2);
    }
}
