//! Times the codec decoder on one stream's chunks: the released 12 Hz decoder on random weights, on the CPU
//! backend. The first chunk from a fresh state is what a stream's first audio waits for; later chunks of the
//! same length show the decoder's steady rate.
//!
//! `cargo run --release -p kazeia-engine --example decoder_chunk [threads] [frames per chunk] [f32|f16] [repeats]`
//! (defaults 2, 1, f16 — the decoder's format under the lossy LM formats — and 5). `KAZEIA_X86_CONV=gemm` (x86-64)
//! or `KAZEIA_ARM_CONV=gemm` (aarch64) times the convolutions on the `gemm` crate instead of the tile kernels.

use std::sync::Arc;
use std::time::Instant;

use kazeia_backend_abi::WeightFormat;
use kazeia_backend_cpu::CpuBackend;
use kazeia_engine::codec::{CodecConfig, CodecDecoder, Trace};
use kazeia_engine::random_weights::RandomWeights;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: usize| {
        args.get(i)
            .map_or(default, |a| a.parse().expect("a number"))
    };
    let (threads, frames) = (arg(0, 2), arg(1, 1));
    let format = match args.get(2).map(String::as_str) {
        Some("f32") => WeightFormat::F32,
        _ => WeightFormat::F16,
    };
    let repeats = arg(3, 5);
    let config = CodecConfig::released();
    let decoder = CodecDecoder::from_parts_as(
        config.clone(),
        &RandomWeights::new(0x5eed),
        Arc::new(CpuBackend::new(threads)),
        format,
    )
    .expect("the released decoder on random weights");
    let cfg = &config.decoder_config;
    // Deterministic codes, each below the codebook size.
    let chunk = |c: usize| -> Vec<Vec<u32>> {
        (0..frames)
            .map(|f| {
                (0..cfg.num_quantizers)
                    .map(|q| {
                        ((c * frames + f) * 7919 + q * 104_729) as u32 % cfg.codebook_size as u32
                    })
                    .collect()
            })
            .collect()
    };
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let (mut first, mut later) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        let mut state = decoder.new_state();
        let t = Instant::now();
        decoder.decode_chunk(&mut state, &chunk(0)).expect("decode");
        first.push(ms(t));
        for c in 1..4 {
            let t = Instant::now();
            decoder.decode_chunk(&mut state, &chunk(c)).expect("decode");
            later.push(ms(t));
        }
    }
    // The first chunk handed out in parts, as a stream's first chunk is: its first samples, and all of them.
    let mut in_parts = Vec::new();
    for parts in [2, 4] {
        let (mut to_first, mut to_all) = (Vec::new(), Vec::new());
        for _ in 0..repeats {
            let mut state = decoder.new_state();
            let t = Instant::now();
            let mut first_part = None;
            decoder
                .decode_chunk_in_parts(&mut state, &chunk(0), parts, Trace::none(), &mut |_| {
                    first_part.get_or_insert_with(|| ms(t));
                    Ok(true)
                })
                .expect("decode");
            to_all.push(ms(t));
            to_first.extend(first_part);
        }
        in_parts.push((parts, to_first, to_all));
    }
    let summary = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        format!("best {:.1} ms, median {:.1} ms", v[0], v[v.len() / 2])
    };
    let first = summary(&mut first);
    let per_frame = later[later.len() / 2] / frames as f64;
    println!(
        "{frames}-frame chunks ({format}, {threads} threads): first from a fresh state {first}"
    );
    println!(
        "  chunks 2-4 {} ({per_frame:.1} ms per 80 ms frame at the median)",
        summary(&mut later)
    );
    for (parts, mut to_first, mut to_all) in in_parts {
        println!(
            "  first in {parts} parts: first part {}; whole chunk {}",
            summary(&mut to_first),
            summary(&mut to_all)
        );
    }
}
