//! Deterministic random weights of whatever shapes the model code asks for, so benchmarks run at the real
//! model sizes without downloading anything. Values are scaled like a trained network's (unit-gain layers,
//! unit norms, small log-scale Snake parameters) so every kernel sees ordinary numbers.

use std::hash::{Hash, Hasher};

use crate::error::Result;
use crate::weights::Weights;

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

    /// Approximately normal: the sum of four uniforms, centred and scaled to unit variance.
    fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.next_f32()).sum();
        (s - 2.0) * 3.0f32.sqrt()
    }
}

impl Weights for RandomWeights {
    fn tensor_shaped(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (self.seed, name).hash(&mut hasher);
        let mut rng = Rng(hasher.finish() | 1);
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
