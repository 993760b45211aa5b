//! Times one talker step and one code-predictor frame for 1, 2, 4 sequences at once on real-size random
//! weights: `cargo run --release -p kazeia-engine --example batch_steps [threads] [format]`.

use std::sync::Arc;
use std::time::Instant;

use kazeia_engine::lm::{GenerationConfig, LmBackends, ModelConfig, TtsModel};
use kazeia_engine::random_weights::RandomWeights;
use kazeia_engine::{CpuBackend, WeightStorage};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads: usize = args.first().map_or(2, |a| a.parse().unwrap());
    let storage: WeightStorage = args.get(1).map_or("q4_0", |s| s).parse().unwrap();
    let backend: Arc<dyn kazeia_engine::Backend> = Arc::new(CpuBackend::new(threads));
    let model = TtsModel::from_parts(
        ModelConfig::released("0.6b").unwrap(),
        GenerationConfig::default(),
        &RandomWeights::new(0x5eed),
        LmBackends::same(backend.clone()),
        storage,
    )
    .unwrap();
    let h = model.talker.hidden();
    let b = backend.as_ref();
    let prompt_rows = 60;
    let x: Vec<f32> = (0..prompt_rows * h)
        .map(|i| ((i % 97) as f32 - 48.0) / 480.0)
        .collect();
    let reps: usize = std::env::var("REPS").map_or(20, |r| r.parse().unwrap());
    let only: Option<usize> = std::env::var("ONLY").ok().map(|r| r.parse().unwrap());
    for round in 0..2 {
        for n in [1usize, 2, 4] {
            if only.is_some_and(|o| o != n) {
                continue;
            }
            let mut caches: Vec<_> = (0..n)
                .map(|_| model.talker.new_cache(prompt_rows + 200))
                .collect();
            for c in &mut caches {
                model.talker.forward(b, &x, prompt_rows, c).unwrap();
            }
            let step: Vec<f32> = x[..n * h].to_vec();
            let t = Instant::now();
            for _ in 0..reps {
                if n == 1 && round == 1 {
                    model.talker.forward(b, &step, 1, &mut caches[0]).unwrap();
                } else {
                    model
                        .talker
                        .forward_batch(b, &step, caches.iter_mut().collect())
                        .unwrap();
                }
            }
            let talker = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
            let mut cp_caches: Vec<_> = (0..n).map(|_| model.code_predictor.new_cache()).collect();
            let t = Instant::now();
            for _ in 0..reps / 4 {
                if n == 1 && round == 1 {
                    model
                        .code_predictor
                        .predict(b, &step[..h], &step[..h], &mut cp_caches[0], &mut |_, _| 7)
                        .unwrap();
                } else {
                    model
                        .code_predictor
                        .predict_batch(b, &step, &step, &mut cp_caches, &mut |_, _, _| 7)
                        .unwrap();
                }
            }
            let cp = t.elapsed().as_secs_f64() * 1e3 / (reps / 4) as f64;
            println!(
                "{} n={n}: talker step {talker:.2} ms ({:.2}/seq), CP frame {cp:.2} ms ({:.2}/seq)",
                if n == 1 && round == 1 {
                    "unbatched"
                } else {
                    "batched  "
                },
                talker / n as f64,
                cp / n as f64
            );
        }
    }
}
