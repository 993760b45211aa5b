//! Token choice with the official settings and order (transformers 4.57 `generate`):
//! repetition penalty on the ids generated so far → EOS masked before `min_new_tokens` → suppressed ids →
//! then, when sampling, temperature → top-k → top-p → softmax → one multinomial draw. Greedy takes the first
//! maximum after the first three steps (the warpers do not change the argmax).

/// Settings of one sampler (the talker's, or the code predictor's "subtalker" ones).
#[derive(Clone, Debug)]
pub struct SamplingParams {
    pub do_sample: bool,
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
}

/// The talker's logit processors.
#[derive(Clone, Debug)]
pub struct TalkerRules {
    pub repetition_penalty: f32,
    pub min_new_tokens: usize,
    pub eos: u32,
    /// `[start, end)` of the suppressed range; `eos` inside it stays allowed.
    pub suppress: (usize, usize),
}

impl TalkerRules {
    /// Applies the processors in place, given the ids generated so far.
    pub fn apply(&self, logits: &mut [f32], generated: &[u32]) {
        if self.repetition_penalty != 1.0 {
            let mut seen = generated.to_vec();
            seen.sort_unstable();
            seen.dedup();
            for id in seen {
                let s = &mut logits[id as usize];
                *s = if *s < 0.0 {
                    *s * self.repetition_penalty
                } else {
                    *s / self.repetition_penalty
                };
            }
        }
        if generated.len() < self.min_new_tokens {
            logits[self.eos as usize] = f32::NEG_INFINITY;
        }
        let end = self.suppress.1.min(logits.len());
        for (id, s) in logits
            .iter_mut()
            .enumerate()
            .take(end)
            .skip(self.suppress.0)
        {
            if id != self.eos as usize {
                *s = f32::NEG_INFINITY;
            }
        }
    }
}

/// Index of the first maximum (as `torch.argmax`).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Chooses a token from processed logits; `uniform` supplies draws in [0, 1) (injected so tests can fix them).
///
/// The work follows what survives: the k-th largest score is selected, not sorted for (a code-predictor step
/// sampled 2048 logits, a full sort and 2048 `exp`s each: ~5 % of the stage), only unmasked scores go through
/// `exp`, and top-p orders only the tokens left. The same choice as the plain definition for every input (the
/// masked tokens' probabilities are exact zeros either way; tests compare the two).
pub fn choose(
    logits: &mut [f32],
    params: &SamplingParams,
    uniform: &mut dyn FnMut() -> f64,
) -> u32 {
    if !params.do_sample {
        return argmax(logits);
    }
    if params.temperature != 1.0 {
        for s in logits.iter_mut() {
            *s /= params.temperature;
        }
    }
    if params.top_k > 0 && params.top_k < logits.len() {
        let mut scores = logits.to_vec();
        let (_, kth, _) = scores.select_nth_unstable_by(params.top_k - 1, |a, b| b.total_cmp(a));
        let kth = *kth;
        for s in logits.iter_mut() {
            if *s < kth {
                *s = f32::NEG_INFINITY;
            }
        }
    }
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let mut probs: Vec<f64> = logits
        .iter()
        .map(|&s| {
            if s == f32::NEG_INFINITY && max != f32::NEG_INFINITY {
                0.0 // exp(−∞), without calling it
            } else {
                ((s - max) as f64).exp()
            }
        })
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    if params.top_p < 1.0 {
        // Drop the least likely tokens whose cumulative mass stays within 1 − top_p; keep at least one. Tokens
        // already at zero would come first and change nothing, so only the others are ordered (a stable sort:
        // ties keep their index order, as among all tokens).
        let mut order: Vec<usize> = (0..probs.len()).filter(|&i| probs[i] > 0.0).collect();
        order.sort_by(|&a, &b| probs[a].total_cmp(&probs[b]));
        let mut cumulative = 0.0;
        for &i in &order[..order.len().saturating_sub(1)] {
            cumulative += probs[i];
            if cumulative <= 1.0 - params.top_p as f64 {
                probs[i] = 0.0;
            } else {
                break;
            }
        }
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
    }
    let u = uniform();
    let mut cumulative = 0.0;
    let mut last_possible = 0;
    for (i, p) in probs.iter().enumerate() {
        if *p > 0.0 {
            cumulative += p;
            last_possible = i;
            if u < cumulative {
                return i as u32;
            }
        }
    }
    last_possible as u32
}

/// A seed for sampling when the user gives none.
pub fn random_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A small seeded generator (SplitMix64) for reproducible sampling with `--seed`.
pub struct SeededRng(u64);

impl SeededRng {
    pub fn new(seed: u64) -> Self {
        SeededRng(seed)
    }

    pub fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> TalkerRules {
        TalkerRules {
            repetition_penalty: 1.05,
            min_new_tokens: 2,
            eos: 6,
            suppress: (5, 8),
        }
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative_scores_once() {
        let mut logits = vec![2.1, -1.0, 0.5, 0.0, 1.0, 0.0, 0.0, 0.0];
        rules().apply(&mut logits, &[0, 1, 0, 0]);
        assert!((logits[0] - 2.0).abs() < 1e-6, "{}", logits[0]);
        assert!((logits[1] + 1.05).abs() < 1e-6);
        assert_eq!(logits[2], 0.5);
    }

    #[test]
    fn eos_is_masked_before_two_new_tokens_and_the_control_range_always() {
        let mut logits = vec![0.0; 8];
        logits[6] = 10.0;
        logits[5] = 20.0;
        rules().apply(&mut logits, &[1]);
        assert_eq!(logits[6], f32::NEG_INFINITY);
        assert_eq!(logits[5], f32::NEG_INFINITY);
        assert_eq!(logits[7], f32::NEG_INFINITY);
        let mut logits = vec![0.0; 8];
        logits[6] = 10.0;
        rules().apply(&mut logits, &[1, 2]);
        assert_eq!(logits[6], 10.0);
        assert_eq!(argmax(&logits), 6);
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut logits = vec![1.0, 3.0, 3.0, 2.0];
        let params = SamplingParams {
            do_sample: false,
            temperature: 0.9,
            top_k: 50,
            top_p: 1.0,
        };
        assert_eq!(choose(&mut logits, &params, &mut || unreachable!()), 1);
    }

    #[test]
    fn sampling_inverts_the_cdf_of_the_tempered_top_k_distribution() {
        let params = SamplingParams {
            do_sample: true,
            temperature: 0.5,
            top_k: 2,
            top_p: 1.0,
        };
        // Logits ln 1, ln 3, ln 0.5 (dropped by top-2): at T = 0.5 the weights are 1 : 9 → p = 0.1, 0.9.
        let logits = [0.0f32, 3f32.ln(), 0.5f32.ln()];
        let pick = |u: f64| choose(&mut logits.to_vec(), &params, &mut || u);
        assert_eq!(pick(0.05), 0);
        assert_eq!(pick(0.0999), 0);
        assert_eq!(pick(0.1001), 1);
        assert_eq!(pick(0.9999), 1);
    }

    #[test]
    fn top_k_keeps_ties_and_top_p_drops_the_tail() {
        let params = SamplingParams {
            do_sample: true,
            temperature: 1.0,
            top_k: 1,
            top_p: 1.0,
        };
        // Two tokens tie for the best score: both survive top-1, as in transformers.
        let logits = [1.0f32, 1.0, 0.0];
        assert_eq!(choose(&mut logits.to_vec(), &params, &mut || 0.75), 1);
        let params = SamplingParams {
            do_sample: true,
            temperature: 1.0,
            top_k: 0,
            top_p: 0.7,
        };
        // p = 0.6, 0.3, 0.1: the tail {0.1} is within 1 − 0.7 and goes; 0.6 / 0.9 then splits the draw.
        let logits = [0.6f32.ln(), 0.3f32.ln(), 0.1f32.ln()];
        assert_eq!(choose(&mut logits.to_vec(), &params, &mut || 0.66), 0);
        assert_eq!(choose(&mut logits.to_vec(), &params, &mut || 0.67), 1);
        assert_eq!(choose(&mut logits.to_vec(), &params, &mut || 0.999), 1);
    }

    /// `choose` as first written: a full sort for top-k, every score through `exp`, every token ordered for
    /// top-p.
    fn choose_by_definition(logits: &mut [f32], params: &SamplingParams, u: f64) -> u32 {
        if params.temperature != 1.0 {
            logits.iter_mut().for_each(|s| *s /= params.temperature);
        }
        if params.top_k > 0 && params.top_k < logits.len() {
            let mut sorted: Vec<f32> = logits.to_vec();
            sorted.sort_unstable_by(|a, b| b.total_cmp(a));
            let kth = sorted[params.top_k - 1];
            logits
                .iter_mut()
                .filter(|s| **s < kth)
                .for_each(|s| *s = f32::NEG_INFINITY);
        }
        let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut probs: Vec<f64> = logits.iter().map(|&s| ((s - max) as f64).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        if params.top_p < 1.0 {
            let mut order: Vec<usize> = (0..probs.len()).collect();
            order.sort_by(|&a, &b| probs[a].total_cmp(&probs[b]));
            let mut cumulative = 0.0;
            for &i in &order[..order.len() - 1] {
                cumulative += probs[i];
                if cumulative <= 1.0 - params.top_p as f64 {
                    probs[i] = 0.0;
                } else {
                    break;
                }
            }
            let total: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= total);
        }
        let (mut cumulative, mut last_possible) = (0.0, 0);
        for (i, p) in probs.iter().enumerate() {
            if *p > 0.0 {
                cumulative += p;
                last_possible = i;
                if u < cumulative {
                    return i as u32;
                }
            }
        }
        last_possible as u32
    }

    /// The selecting, skipping `choose` picks what the definition picks: vocabularies of the code predictor's
    /// and the talker's sizes, masked and tied scores, every top-k and top-p regime, draws across [0, 1).
    #[test]
    fn choose_picks_what_the_definition_picks() {
        let mut rng = SeededRng::new(11);
        for case in 0..300 {
            let n = [2048, 3072, 7, 50][case % 4];
            let mut logits: Vec<f32> = (0..n)
                .map(|_| (rng.uniform() * 12.0 - 6.0) as f32)
                .collect();
            // Masked scores (suppressed ids) and ties.
            for i in (0..n).step_by(5 + case % 7) {
                logits[i] = f32::NEG_INFINITY;
            }
            for i in (3..n).step_by(11) {
                logits[i] = logits[i - 3];
            }
            let params = SamplingParams {
                do_sample: true,
                temperature: [0.9, 1.0, 0.7][case % 3],
                top_k: [50, 0, 1, 2, 4096][case % 5],
                top_p: [1.0, 0.8, 0.95, 0.0][(case / 5) % 4],
            };
            let u = rng.uniform();
            let want = choose_by_definition(&mut logits.clone(), &params, u);
            let got = choose(&mut logits.clone(), &params, &mut || u);
            assert_eq!(got, want, "case {case}: {params:?}, u = {u}");
        }
    }

    #[test]
    fn seeded_rng_is_reproducible_and_in_range() {
        let (mut a, mut b) = (SeededRng::new(7), SeededRng::new(7));
        for _ in 0..1000 {
            let x = a.uniform();
            assert_eq!(x, b.uniform());
            assert!((0.0..1.0).contains(&x));
        }
    }
}
