//! What building a stage's op list costs the engine, apart from any computation: the released 0.6B talker step
//! and code-predictor frame (15 steps) built on a backend that runs nothing, holding ops back as a list-taking
//! backend does (the CPU and the devices: one list per stage) and handing them over op by op.
//!
//! `cargo run --release -p kazeia-engine --example graph_overhead`

use std::sync::Arc;
use std::time::Instant;

use kazeia_backend_abi::list::List;
use kazeia_backend_abi::{Backend, Capabilities, Weight, WeightData};
use kazeia_engine::lm::{GenerationConfig, LmBackends, ModelConfig, TtsModel};
use kazeia_engine::random_weights::RandomWeights;
use kazeia_engine::WeightStorage;

/// Holds no weights and runs nothing: what remains of a step is the engine's own work.
struct Nothing {
    lists: bool,
}

impl Backend for Nothing {
    fn name(&self) -> &str {
        "nothing"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(if self.lists { Capabilities::LISTS } else { 0 })
    }

    fn upload(&self, weight: WeightData<'_>) -> Result<Weight, String> {
        weight.check()?;
        Ok(Weight::new(()))
    }

    unsafe fn run_list(&self, list: List<'_>) -> Result<(), String> {
        list.check()
    }
}

fn main() {
    let reps = 50;
    for lists in [true, false] {
        let backend: Arc<dyn Backend> = Arc::new(Nothing { lists });
        let model = TtsModel::from_parts(
            ModelConfig::released("0.6b").unwrap(),
            GenerationConfig::default(),
            &RandomWeights::new(0x5eed),
            LmBackends::same(backend.clone()),
            WeightStorage::AsStored,
        )
        .unwrap();
        let b = backend.as_ref();
        let h = model.talker.hidden();
        let prompt = vec![0.01f32; 24 * h];
        let mut cache = model.talker.new_cache(24 + reps + 1);
        model.talker.forward(b, &prompt, 24, &mut cache).unwrap();
        let step = vec![0.01f32; h];
        let t = Instant::now();
        for _ in 0..reps {
            model.talker.forward(b, &step, 1, &mut cache).unwrap();
        }
        let talker = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
        let mut cp_cache = model.code_predictor.new_cache();
        let t = Instant::now();
        for _ in 0..reps {
            model
                .code_predictor
                .predict(b, &step, &step, &mut cp_cache, &mut |_, _| 7)
                .unwrap();
        }
        let cp = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
        println!(
            "{}: talker step {talker:.0} µs, code-predictor frame (15 steps) {cp:.0} µs of engine work",
            if lists {
                "one list per stage (a device)"
            } else {
                "op by op (the CPU)          "
            }
        );
    }
}
