//! Weights of a codec fixture too large to commit (the released decoder shape: 114 M values), made from a seed by
//! the counter-based generator that `tools/make_fixtures.py` also implements (`seeded_uniform`), so both sides
//! hold the same values bit for bit. The fixture's `seeded_weights.json` gives the seed and, per tensor, its
//! shape, `offset` and `scale`: element `i` is `f32(offset + scale · u_i)` with
//! `u_i = (2·(h_i >> 40) + 1 − 2²⁴) / 2²⁴`, `h_i = mix64(key + (i + 1)·φ)`, `key = mix64(seed ^ fnv1a64(name) + φ)`.

use std::collections::BTreeMap;
use std::path::Path;

use kazeia_engine::weights::Weights;
use serde_json::Value;

const PHI: u64 = 0x9E37_79B9_7F4A_7C15;

fn fnv1a64(text: &str) -> u64 {
    text.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// SplitMix64's finaliser.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `u_i` of tensor `name`: in (−1, 1), exact in f64.
pub fn uniform(seed: u64, name: &str, i: u64) -> f64 {
    let key = mix64((seed ^ fnv1a64(name)).wrapping_add(PHI));
    let h = mix64(key.wrapping_add((i + 1).wrapping_mul(PHI)));
    ((h >> 40) as f64 * 2.0 + 1.0 - (1u64 << 24) as f64) / (1u64 << 24) as f64
}

struct Rule {
    shape: Vec<usize>,
    offset: f64,
    scale: f64,
}

/// The tensors of a fixture's `seeded_weights.json`.
pub struct SeededWeights {
    seed: u64,
    rules: BTreeMap<String, Rule>,
}

impl SeededWeights {
    pub fn open(path: &Path) -> Self {
        let text = std::fs::read_to_string(path).unwrap();
        let json: Value = serde_json::from_str(&text).unwrap();
        let number = |v: &Value| v.as_str().unwrap().parse::<f64>().unwrap();
        let rules = json["tensors"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(name, rule)| {
                let shape = rule["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap() as usize)
                    .collect();
                let rule = Rule {
                    shape,
                    offset: number(&rule["offset"]),
                    scale: number(&rule["scale"]),
                };
                (name.clone(), rule)
            })
            .collect();
        SeededWeights {
            seed: json["seed"].as_u64().unwrap(),
            rules,
        }
    }
}

impl Weights for SeededWeights {
    fn tensor_shaped(&self, name: &str, shape: &[usize]) -> kazeia_engine::Result<Vec<f32>> {
        let rule = self
            .rules
            .get(name)
            .ok_or_else(|| kazeia_engine::Error::Input(format!("no seeded tensor `{name}`")))?;
        // The checkpoint's shape, read as `shape` (same element count, e.g. a 1×1 conv as a matrix).
        assert_eq!(
            rule.shape.iter().product::<usize>(),
            shape.iter().product::<usize>(),
            "{name}: seeded shape {:?}, asked for {shape:?}",
            rule.shape
        );
        let count = shape.iter().product::<usize>() as u64;
        Ok((0..count)
            .map(|i| (rule.offset + rule.scale * uniform(self.seed, name, i)) as f32)
            .collect())
    }
}

/// Values `seeded_uniform` of tools/make_fixtures.py gives (also past its first block of 2²² elements).
pub fn check_against_python() {
    let u: Vec<f64> = (0..3)
        .map(|i| uniform(1, "decoder.pre_conv.conv.bias", i))
        .collect();
    assert_eq!(
        u,
        [0.503519594669342, 0.41779571771621704, -0.8412081599235535]
    );
    assert_eq!(
        uniform(7, "decoder.decoder.6.conv.weight", 5_000_000),
        0.9618398547172546
    );
}
