//! A short probe of the machine's f32 multiply-add rate: the ceiling of the codec decoder, which is bound by
//! arithmetic, so `kazeia bench` can set the decoder's rate against it (as `bandwidth.rs` does the language
//! model's against the read rate).
//!
//! Each thread runs chains of fused multiply-adds on independent accumulators, enough of them to cover the FMA
//! units' latency, in the widest vectors this CPU has (AVX-512, AVX2 with FMA, NEON), and nothing else: no
//! loads, no stores. It is what the kernels' inner loops can reach at best, not what a whole convolution does.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

/// Multiply-adds per accumulator and pass.
const STEPS: usize = 2_000_000;
/// Passes; the rate is the best one's.
const PASSES: usize = 5;

/// f32 multiply-adds per second (10⁹) over `threads` threads, all running at once.
pub fn fma_peak_gmacs(threads: usize) -> f64 {
    let threads = threads.max(1);
    let barrier = Barrier::new(threads);
    let mut best = 0.0f64;
    for _ in 0..PASSES {
        let began = Instant::now();
        let macs: usize = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| {
                        barrier.wait();
                        let (value, macs) = multiply_adds(black_box(STEPS));
                        black_box(value);
                        macs
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        best = best.max(macs as f64 / began.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// Runs `steps` multiply-adds on each of this CPU's accumulators; (their sum, the multiply-adds done).
fn multiply_adds(steps: usize) -> (f32, usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F is present (checked above).
            return unsafe { chains_avx512(steps) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: AVX2 and FMA are present (checked above).
            return unsafe { chains_avx2(steps) };
        }
    }
    chains::<96>(steps)
}

/// `N` independent chains `a ← a·x + y`, which the compiler keeps in vector registers (96 floats: 24 NEON or 12
/// AVX2 registers; 256: 16 AVX-512 ones). `a` tends to y / (1 − x) = 1: no overflow, no subnormals.
#[inline(always)]
fn chains<const N: usize>(steps: usize) -> (f32, usize) {
    let (x, y) = (black_box(0.999f32), black_box(0.001f32));
    let mut a = [0.5f32; N];
    for _ in 0..steps {
        for lane in a.iter_mut() {
            *lane = lane.mul_add(x, y);
        }
    }
    (a.iter().sum(), N * steps)
}

/// [`chains`] on AVX-512.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn chains_avx512(steps: usize) -> (f32, usize) {
    chains::<256>(steps)
}

/// [`chains`] on AVX2 with FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chains_avx2(steps: usize) -> (f32, usize) {
    chains::<96>(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chains_converge_and_count_their_work() {
        let (sum, macs) = chains::<8>(10_000);
        assert_eq!(macs, 80_000);
        // Each chain is within 0.999^10000 · 0.5 of 1.
        assert!((sum - 8.0).abs() < 1e-3, "{sum}");
    }

    #[test]
    fn a_probe_ends_with_a_rate_for_any_thread_count() {
        for threads in [1, 2] {
            let gmacs = fma_peak_gmacs(threads);
            assert!(
                gmacs.is_finite() && gmacs > 0.0,
                "{threads} threads: {gmacs}"
            );
        }
    }
}
