//! Times one linear layer per weight format: `cargo run --release -p kazeia-backend-cpu --example gemv_speed
//! [out] [in] [rows] [threads] [format]`. Weights of 12 MB and more come from L3/DRAM as in the real model;
//! `GEMV_COPIES=1` keeps one copy (in cache), `GEMV_ITERS=N` sets the number of timed calls.

use std::time::Instant;

use kazeia_backend_abi::{Backend, WeightFormat};
use kazeia_backend_cpu::CpuBackend;

fn main() {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let only = all.get(4).cloned();
    let args: Vec<usize> = all
        .iter()
        .take(4)
        .map(|a| a.parse().expect("numbers"))
        .collect();
    let (out, inp, rows, threads) = (
        *args.first().unwrap_or(&3072),
        *args.get(1).unwrap_or(&1024),
        *args.get(2).unwrap_or(&1),
        *args.get(3).unwrap_or(&1),
    );
    let backend = CpuBackend::new(threads);
    let w: Vec<f32> = (0..out * inp)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let x: Vec<f32> = (0..rows * inp)
        .map(|i| ((i * 31) % 100) as f32 / 100.0)
        .collect();
    // Several copies so the working set exceeds the caches, as 28 layers do.
    let copies = std::env::var("GEMV_COPIES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or((256 << 20) / (out * inp * 2).max(1) + 1);
    for format in [
        WeightFormat::F32,
        WeightFormat::BF16,
        WeightFormat::F16,
        WeightFormat::Q8_0,
        WeightFormat::Q4_0,
    ]
    .into_iter()
    .filter(|f| only.as_ref().is_none_or(|o| f.to_string() == *o))
    {
        let layers: Vec<_> = (0..copies.min(64))
            .map(|_| backend.upload_linear(&w, out, inp, None, format))
            .collect();
        let mut y = vec![0.0; rows * out];
        let iters = std::env::var("GEMV_ITERS")
            .ok()
            .and_then(|i| i.parse().ok())
            .unwrap_or((400_000_000 / (out * inp * rows)).clamp(200, 20_000));
        let start = Instant::now();
        for i in 0..iters {
            backend.linear(&layers[i % layers.len()], &x, rows, &mut y);
        }
        let per = start.elapsed().as_secs_f64() / iters as f64;
        let gmacs = (out * inp * rows) as f64 / per / 1e9;
        println!(
            "{format:>5}: {:8.1} µs per call, {gmacs:6.2} GMAC/s",
            per * 1e6
        );
    }
}
