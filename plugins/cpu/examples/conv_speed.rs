//! Times the codec decoder's convolutions at their real shapes, per stage: `cargo run --release -p
//! kazeia-backend-cpu --example conv_speed [threads] [frames] [f32|f16] [rounds]` (frames per chunk: 8 as the
//! stream's later chunks, 1 as its first; random weights). Each layer's time is the best of `rounds` (5) rounds
//! of repeated calls, as the machine may be shared. Run it again with `KAZEIA_ARM_CONV=gemm` (aarch64, ARM.md)
//! or `KAZEIA_X86_CONV=gemm` (x86-64) to compare the tile kernels with the `gemm` crate's path, and with
//! `KAZEIA_CONV_WINOGRAD=1` to compare Winograd's 7-tap convolutions (an opt-in) with the direct ones, or with
//! `KAZEIA_CONV_SPEED=fast` for the fast decoder mode's convolutions.

use std::time::Instant;

use kazeia_backend_abi::{Backend, WeightData, WeightFormat};
use kazeia_backend_cpu::{ConvPrecision, CpuBackend};

/// One layer: a dilated conv (`dilation`) or a transposed conv (`stride`), and its input columns per chunk.
struct Layer {
    stage: &'static str,
    transposed: bool,
    cin: usize,
    cout: usize,
    k: usize,
    step: usize,
    cols: usize,
}

/// The released 12 Hz decoder's convolutions for a chunk of `frames` (12.5 Hz) frames.
fn decoder(frames: usize) -> Vec<Layer> {
    let l = |stage, transposed, cin, cout, k, step, cols| Layer {
        stage,
        transposed,
        cin,
        cout,
        k,
        step,
        cols,
    };
    let mut v = vec![
        l("pre_conv", false, 512, 1024, 3, 1, frames),
        l("upsample", true, 1024, 1024, 2, 2, frames),
        l("upsample", true, 1024, 1024, 2, 2, 2 * frames),
        l("input conv", false, 1024, 1536, 7, 1, 4 * frames),
    ];
    let (mut cols, mut ch) = (4 * frames, 1536);
    for (stage, rate) in [
        ("block 1", 8),
        ("block 2", 5),
        ("block 3", 4),
        ("block 4", 3),
    ] {
        v.push(l(stage, true, ch, ch / 2, 2 * rate, rate, cols));
        (cols, ch) = (cols * rate, ch / 2);
        for d in [1, 3, 9] {
            v.push(l(stage, false, ch, ch, 7, d, cols));
            v.push(l(stage, false, ch, ch, 1, 1, cols));
        }
    }
    v.push(l("output conv", false, ch, 1, 7, 1, cols));
    v
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads = args.first().map_or(1, |a| a.parse().expect("threads"));
    let frames = args.get(1).map_or(8, |a| a.parse().expect("frames"));
    let format = match args.get(2).map(String::as_str) {
        Some("f16") => WeightFormat::F16,
        _ => WeightFormat::F32,
    };
    let rounds = args.get(3).map_or(5, |a| a.parse().expect("rounds"));
    let backend = CpuBackend::new(threads);
    let backend = if std::env::var("KAZEIA_CONV_SPEED").as_deref() == Ok("fast") {
        backend.with_conv_precision(ConvPrecision::Fast)
    } else {
        backend
    };
    let value = |i: usize| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5;
    let mut stages: Vec<(&str, f64, f64)> = Vec::new();
    for layer in decoder(frames) {
        let Layer {
            stage,
            transposed,
            cin,
            cout,
            k,
            step,
            cols,
        } = layer;
        let w: Vec<f32> = (0..cin * cout * k).map(value).collect();
        let weight = if transposed {
            WeightData::ConvTranspose1d {
                w: &w,
                cin,
                cout,
                k,
                stride: step,
                format,
            }
        } else {
            WeightData::Conv1d {
                w: &w,
                cout,
                cin,
                k,
                bias: None,
                format,
            }
        };
        let weight = backend.upload(weight).expect("upload");
        // A causal conv sees its left context too: `cols + span` input columns.
        let len = if transposed {
            cols
        } else {
            cols + (k - 1) * step
        };
        let x: Vec<f32> = (0..cin * len).map(|i| value(i * 31)).collect();
        let (out, macs) = if transposed {
            ((len - 1) * step + k, cin * cout * k * cols)
        } else {
            (cols, cin * cout * k * cols)
        };
        let mut y = vec![0.0; cout * out];
        let run = |y: &mut [f32]| {
            if transposed {
                backend.conv_transpose1d(&weight, &x, len, y);
            } else {
                backend.conv1d(&weight, &x, len, step, y);
            }
        };
        run(&mut y);
        let iters = (400_000_000 / macs).clamp(2, 100);
        let per = (0..rounds)
            .map(|_| {
                let start = Instant::now();
                for _ in 0..iters {
                    run(&mut y);
                }
                start.elapsed().as_secs_f64() / iters as f64
            })
            .fold(f64::INFINITY, f64::min);
        let what = if transposed { "tconv" } else { "conv" };
        println!(
            "{stage:>11} {what:>5} {cin:>4}→{cout:<4} k{k:<2} {}{step} {cols:>6} cols: {:8.3} ms, {:6.2} GMAC/s",
            if transposed { "s" } else { "d" },
            per * 1e3,
            macs as f64 / per / 1e9
        );
        match stages.last_mut() {
            Some(s) if s.0 == stage => (s.1, s.2) = (s.1 + per, s.2 + macs as f64),
            _ => stages.push((stage, per, macs as f64)),
        }
    }
    println!(
        "per 80 ms frame ({format}, {threads} threads, {frames}-frame chunks, best of {rounds} rounds):"
    );
    let total: f64 = stages.iter().map(|s| s.1).sum();
    for (stage, secs, macs) in &stages {
        println!(
            "{stage:>11}: {:7.2} ms, {:6.2} GMAC/s",
            secs * 1e3 / frames as f64,
            macs / secs / 1e9
        );
    }
    println!(
        "{:>11}: {:7.2} ms",
        "all convs",
        total * 1e3 / frames as f64
    );
}
