//! Where the codec decoder leaves the truth: every stage of a fixture's decode against the official decoder
//! evaluated in f64, beside the official f32's own distance.
//!
//! `tools/make_fixtures.py --truth-only --codec-case CASE --dump DIR` (or a case's generation with `--dump`)
//! saves the official f32 and f64 stages as `DIR/CASE.{f32,f64}.safetensors`; then
//!
//! `cargo run --release -p kazeia-engine --example decoder_truth -- DIR CASE… [--winograd]`
//!
//! prints, per stage, the max abs error against f64 relative to the stage's peak, for the official f32 and for
//! Kazeia (the default CPU backend, or `--winograd` convolutions), and their ratio.

#[path = "../tests/it/common/seeded_weights.rs"]
#[allow(dead_code)] // the tests' check against Python is not used here
mod seeded_weights;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use kazeia_engine::codec::{CodecConfig, CodecDecoder};
use kazeia_engine::codes::parse_codes_json;
use kazeia_engine::CpuBackend;

fn read_all(path: &Path) -> BTreeMap<String, Vec<f64>> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .map(|(name, t)| {
            let data = match t.dtype() {
                safetensors::Dtype::F64 => t
                    .data()
                    .chunks_exact(8)
                    .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
                safetensors::Dtype::F32 => t
                    .data()
                    .chunks_exact(4)
                    .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
                    .collect(),
                other => panic!("{name}: {other:?}"),
            };
            (name, data)
        })
        .collect()
}

fn max_abs(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let winograd = args.iter().any(|a| a == "--winograd");
    let threads: usize = std::env::var("THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(2);
    let dump = Path::new(&args[0]);
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/codec");
    for case in args[1..].iter().filter(|a| !a.starts_with("--")) {
        let dir = fixtures.join(case);
        let mut backend = CpuBackend::new(threads);
        if winograd {
            backend = backend.with_winograd_convolutions();
        }
        let backend = Arc::new(backend);
        let decoder = if dir.join("seeded_weights.json").is_file() {
            let config = CodecConfig::load(&dir.join("speech_tokenizer/config.json")).unwrap();
            let weights = seeded_weights::SeededWeights::open(&dir.join("seeded_weights.json"));
            CodecDecoder::from_parts(config, &weights, backend).unwrap()
        } else {
            CodecDecoder::load(&dir, backend).unwrap()
        };
        let codes =
            parse_codes_json(&std::fs::read_to_string(dir.join("codes.json")).unwrap()).unwrap();
        let mut ours: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        let wav = decoder
            .decode_traced(&codes, &mut |name, data| {
                ours.insert(
                    name.to_owned(),
                    data.iter().map(|&v| f64::from(v)).collect(),
                );
            })
            .unwrap();
        ours.insert("wav".into(), wav.iter().map(|&v| f64::from(v)).collect());
        let official = read_all(&dump.join(format!("{case}.f32.safetensors")));
        let truth = read_all(&dump.join(format!("{case}.f64.safetensors")));
        let committed = read_all(&dir.join("golden.safetensors"));
        println!(
            "{case} ({}):",
            if winograd { "Winograd" } else { "default" }
        );
        println!(
            "  {:<16} {:>9} {:>11} {:>11} {:>6}",
            "stage", "peak", "official", "Kazeia", "ratio"
        );
        let mut order: Vec<&String> = truth.keys().collect();
        let rank = |n: &str| {
            let prefix = [
                "quantizer",
                "pre_conv",
                "pre_transformer",
                "upsample",
                "decoder",
                "wav",
            ];
            let i = prefix.iter().position(|p| n.starts_with(p)).unwrap_or(9);
            let j: usize = n.rsplit('.').next().unwrap().parse().unwrap_or(0);
            (i, j)
        };
        order.sort_by_key(|n| rank(n));
        for name in order {
            let (Some(t), Some(o), Some(k)) = (truth.get(name), official.get(name), ours.get(name))
            else {
                continue;
            };
            let peak = t.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let (eo, ek) = (max_abs(o, t) / peak, max_abs(k, t) / peak);
            println!(
                "  {name:<16} {peak:>9.3} {eo:>11.3e} {ek:>11.3e} {:>6.2}",
                ek / eo
            );
        }
        if let Some(c) = committed.get("wav") {
            let t = &truth["wav"];
            println!(
                "  wav: committed official f32 {:.3e}, Kazeia {:.3e} ({:.2}×)",
                max_abs(c, t),
                max_abs(&ours["wav"], t),
                max_abs(&ours["wav"], t) / max_abs(c, t)
            );
        }
    }
}
