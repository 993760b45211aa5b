//! `kazeia bench`: per-stage timings on real-size random weights or on a model directory.
//!
//! This first version measures the codec decoder (the talker and code-predictor rows join when those stages
//! exist). Each stage's time is the wall time between the decoder's stage boundaries.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use kazeia_engine::codec::{CodecConfig, CodecDecoder};
use kazeia_engine::random_weights::RandomWeights;
use kazeia_engine::CpuBackend;

#[derive(Args)]
pub struct BenchArgs {
    /// Random weights of a released model's shapes: 0.6b or 1.7b (the codec is the same for both).
    #[arg(long, value_parser = ["0.6b", "1.7b"], conflicts_with = "model")]
    random: Option<String>,
    /// A model directory in the released layout.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Frames to decode (12.5 frames per second of audio).
    #[arg(long, default_value_t = 31)]
    frames: usize,
    /// Worker threads for the CPU backend.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Timed runs after one warm-up run; the table shows the fastest.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// Decoder stage groups, in pipeline order, with the trace names that close each.
const STAGES: [&str; 5] = [
    "quantizer",
    "pre_conv",
    "pre_transformer",
    "upsample",
    "bigvgan",
];

fn stage_of(trace_name: &str) -> usize {
    match trace_name {
        "quantizer" => 0,
        "pre_conv" => 1,
        "pre_transformer" => 2,
        n if n.starts_with("upsample.") => 3,
        _ => 4,
    }
}

pub fn run(args: BenchArgs) -> Result<()> {
    if args.frames == 0 || args.repeat == 0 {
        bail!("--frames and --repeat must be positive");
    }
    let backend = Arc::new(CpuBackend::new(args.threads));
    let load_start = Instant::now();
    let (decoder, source) = match (&args.random, &args.model) {
        (Some(size), None) => {
            let weights = RandomWeights::new(0x5eed);
            let decoder = CodecDecoder::from_parts(CodecConfig::released(), &weights, backend)?;
            (decoder, format!("random {size} weights"))
        }
        (None, Some(dir)) => {
            let decoder = CodecDecoder::load(dir, backend)
                .with_context(|| format!("cannot load the codec decoder from {}", dir.display()))?;
            (decoder, dir.display().to_string())
        }
        _ => bail!("give either --random 0.6b|1.7b or --model DIR"),
    };
    let load_ms = load_start.elapsed().as_secs_f64() * 1e3;

    let q = decoder.config().decoder_config.num_quantizers;
    let size = decoder.config().decoder_config.codebook_size as u32;
    let codes: Vec<Vec<u32>> = (0..args.frames)
        .map(|f| {
            (0..q)
                .map(|k| ((f * 7919 + k * 104_729) as u32) % size)
                .collect()
        })
        .collect();
    let audio_s = (args.frames * decoder.samples_per_frame()) as f64 / decoder.sample_rate() as f64;

    let mut best: Option<(f64, [f64; 5])> = None;
    for run in 0..=args.repeat {
        let mut stage_s = [0.0f64; 5];
        let start = Instant::now();
        let mut last = start;
        decoder.decode_traced(&codes, &mut |name, _| {
            let now = Instant::now();
            stage_s[stage_of(name)] += (now - last).as_secs_f64();
            last = now;
        })?;
        let total = start.elapsed().as_secs_f64();
        if run > 0 && best.is_none_or(|(t, _)| total < t) {
            best = Some((total, stage_s));
        }
    }
    let (total, stage_s) = best.expect("at least one timed run");
    let per_audio = total / audio_s;
    let rss = peak_rss_mb();

    if args.json {
        let stages: Vec<String> = STAGES
            .iter()
            .zip(stage_s)
            .map(|(n, s)| format!("\"decoder_{n}_ms\": {:.2}", s * 1e3))
            .collect();
        println!(
            "{{\"source\": \"{source}\", \"frames\": {}, \"threads\": {}, \"audio_s\": {audio_s:.3}, \
             \"decoder_ms\": {:.2}, \"decoder_s_per_audio_s\": {per_audio:.4}, {}, \"load_ms\": {load_ms:.1}, \
             \"peak_rss_mb\": {rss:.1}}}",
            args.frames,
            args.threads,
            total * 1e3,
            stages.join(", ")
        );
    } else {
        println!(
            "kazeia bench — {source}, {} frames ({audio_s:.2} s of audio), {} thread(s), best of {}",
            args.frames, args.threads, args.repeat
        );
        println!("{:<28}{:>12}{:>14}", "stage", "ms", "s / s audio");
        for (name, s) in STAGES.iter().zip(stage_s) {
            println!(
                "{:<28}{:>12.1}{:>14.4}",
                format!("decoder: {name}"),
                s * 1e3,
                s / audio_s
            );
        }
        println!(
            "{:<28}{:>12.1}{:>14.4}",
            "decoder total",
            total * 1e3,
            per_audio
        );
        println!("load {load_ms:.0} ms, peak RSS {rss:.0} MB");
    }
    Ok(())
}

/// Peak resident set size of this process (`VmHWM`), in MB; 0 where /proc is not available.
fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}
