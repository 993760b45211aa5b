//! Deterministic random weights of whatever shapes the model code asks for, so benchmarks run at the real
//! model sizes without downloading anything. Values are scaled like a trained network's (unit-gain layers,
//! unit norms, small log-scale Snake parameters) so every kernel sees ordinary numbers.

use std::hash::{Hash, Hasher};

use crate::error::Result;
use crate::weights::{EmbeddingTable, Weights};

pub struct RandomWeights {
    seed: u64,
}

impl RandomWeights {
    pub fn new(seed: u64) -> Self {
        RandomWeights { seed }
    }
}

/// xorshift64*, seeded per tensor name.
struct Rng(u64);

impl Rng {
    fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
        bits as f32 / (1u64 << 24) as f32
    }

    /// Zero mean, unit variance (uniform on ±√3: cheap, and the kernels only need ordinary numbers).
    fn normal(&mut self) -> f32 {
        (self.next_f32() * 2.0 - 1.0) * 3.0f32.sqrt()
    }
}

impl RandomWeights {
    fn rng(&self, name: &str, row: Option<usize>) -> Rng {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (self.seed, name, row).hash(&mut hasher);
        Rng(hasher.finish() | 1)
    }

    /// Row `index` of a random `[rows, cols]` embedding table.
    pub fn embedding_row(seed: u64, name: &str, index: usize, cols: usize, out: &mut Vec<f32>) {
        let mut rng = RandomWeights { seed }.rng(name, Some(index));
        out.extend((0..cols).map(|_| rng.normal()));
    }
}

impl Weights for RandomWeights {
    fn embedding_table(&self, name: &str, rows: usize, cols: usize) -> Result<EmbeddingTable> {
        Ok(EmbeddingTable::Random {
            seed: self.seed,
            name: name.to_owned(),
            rows,
            cols,
        })
    }

    fn tensor_shaped(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let mut rng = self.rng(name, None);
        let count: usize = shape.iter().product();
        let leaf = name.rsplit('.').next().unwrap_or(name);
        let values = match (leaf, shape.len()) {
            ("cluster_usage", _) => (0..count).map(|_| 0.5 + rng.next_f32()).collect(),
            ("alpha" | "beta", _) => (0..count).map(|_| 0.3 * rng.normal()).collect(),
            ("scale" | "gamma", _) => (0..count).map(|_| 0.1 * rng.next_f32()).collect(),
            ("bias", _) => (0..count).map(|_| 0.02 * rng.normal()).collect(),
            ("weight", 1) => (0..count).map(|_| 1.0 + 0.1 * rng.normal()).collect(),
            _ => {
                let fan_in: usize = shape.iter().skip(1).product::<usize>().max(1);
                let std = 1.0 / (fan_in as f32).sqrt();
                (0..count).map(|_| std * rng.normal()).collect()
            }
        };
        Ok(values)
    }
}
