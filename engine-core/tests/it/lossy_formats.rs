//! The lossy weight formats (q8_0, q4_0) against f32, by a metric that can fail.
//!
//! The f32 model runs greedily for a fixed number of frames; each lossy model is then teacher-forced along that
//! same path, so both see the same inputs at every position (codebook 0 from the talker, codebooks 1..15 from
//! the code predictor). At each position the lossy model's greedy choice is scored by the f32 model's
//! log-probability there: the mean *shortfall* (f32 greedy log-prob − that of the lossy choice, in nats; 0 when
//! they agree, > 0 otherwise) and the share of positions where the choices agree are bounded per stage. The
//! distributions are the raw model's over the codebook (the talker's control-token window left out, as the
//! sampler suppresses it; no repetition penalty: the metric is about the weights, not the sampling rules).
//!
//! Under these formats the codec decoder is held in f16 (`WeightStorage::decoder_format`); its waveform is
//! bounded separately, by SNR against the official one (`codec_parity.rs`, `decoder_held_in_f16`).
//!
//! `tiny_fixtures` runs in CI on the committed fixtures. The real-size check is ignored (2.6 GB peak, 2.5 min of
//! CPU time):
//! `cargo test -p kazeia-engine --test it lossy_formats:: -- --ignored --nocapture` (the test profile is optimised).

use crate::common;

use std::sync::Arc;

use common::lm_fixtures::{model_as, request, runs};

use kazeia_engine::lm::sampler::argmax;
use kazeia_engine::lm::{
    GenerationConfig, LmBackends, ModelConfig, Prompt, PromptRequest, TtsModel,
};
use kazeia_engine::random_weights::RandomWeights;
use kazeia_engine::{CpuBackend, WeightFormat, WeightStorage};

/// The logits at every position of one teacher-forced (or greedy) run, and the path taken.
struct Trace {
    path: Vec<Vec<u32>>,
    /// Per frame: the talker's logits over the codebook, then the code predictor's per step.
    talker: Vec<Vec<f32>>,
    code_predictor: Vec<Vec<f32>>,
}

/// Runs `frames` frames, choosing greedily, or following `forced` if given.
fn trace(model: &TtsModel, prompt: &Prompt, frames: usize, forced: Option<&[Vec<u32>]>) -> Trace {
    let (backend, cp_backend) = (model.backend.as_ref(), model.cp_backend.as_ref());
    let (talker, cp) = (&model.talker, &model.code_predictor);
    // The codebook: the talker's last 1024 ids are control tokens, suppressed when sampling.
    let codebook = talker.vocab() - 1024;
    let mut cache = talker.new_cache(prompt.rows + frames);
    let mut cp_cache = cp.new_cache();
    let (mut hidden, mut logits) = talker
        .forward(backend, &prompt.embeds, prompt.rows, &mut cache)
        .unwrap();
    let mut out = Trace {
        path: Vec::new(),
        talker: Vec::new(),
        code_predictor: Vec::new(),
    };
    for f in 0..frames {
        let scores = logits[..codebook].to_vec();
        let token = forced.map_or_else(|| argmax(&scores), |p| p[f][0]);
        out.talker.push(scores);
        let rest = cp
            .predict(
                cp_backend,
                &hidden,
                talker.codec_vector(token),
                &mut cp_cache,
                &mut |step, logits| {
                    out.code_predictor.push(logits.to_vec());
                    forced.map_or_else(|| argmax(logits), |p| p[f][step + 1])
                },
            )
            .unwrap();
        let mut frame = vec![token];
        frame.extend(&rest);
        out.path.push(frame);
        if f + 1 == frames {
            break;
        }
        // The next input, as `generate` builds it.
        let mut next = talker.codec_vector(token).to_vec();
        for (k, &code) in rest.iter().enumerate() {
            for (a, b) in next.iter_mut().zip(cp.embedding(k, code).unwrap()) {
                *a += b;
            }
        }
        for (a, b) in next.iter_mut().zip(prompt.trailing_at(f)) {
            *a += b;
        }
        (hidden, logits) = talker.forward(backend, &next, 1, &mut cache).unwrap();
    }
    out
}

/// Mean shortfall (nats) and share of agreeing greedy choices of `lossy` against `reference`, position by
/// position.
#[derive(Clone, Copy, Debug)]
struct Score {
    shortfall: f64,
    agreement: f64,
}

fn score(reference: &[Vec<f32>], lossy: &[Vec<f32>]) -> Score {
    assert_eq!(reference.len(), lossy.len());
    let (mut shortfall, mut agree) = (0.0, 0usize);
    for (r, l) in reference.iter().zip(lossy) {
        let max = r.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
        let log_z = max + r.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
        let (best, chosen) = (argmax(r) as usize, argmax(l) as usize);
        shortfall += (r[best] as f64 - log_z) - (r[chosen] as f64 - log_z);
        agree += usize::from(best == chosen);
    }
    let n = reference.len() as f64;
    Score {
        shortfall: shortfall / n,
        agreement: agree as f64 / n,
    }
}

/// The talker's and the code predictor's scores of `lossy` teacher-forced on `reference`'s path.
fn compare(reference: &Trace, model: &TtsModel, prompt: &Prompt) -> (Score, Score) {
    let lossy = trace(model, prompt, reference.path.len(), Some(&reference.path));
    assert_eq!(
        lossy.path, reference.path,
        "teacher forcing follows the path"
    );
    (
        score(&reference.talker, &lossy.talker),
        score(&reference.code_predictor, &lossy.code_predictor),
    )
}

/// Bounds of one format: the talker's and the code predictor's (shortfall at most, agreement at least).
struct Bounds {
    format: WeightFormat,
    talker: Score,
    code_predictor: Score,
}

fn check(what: &str, bounds: &Bounds, (talker, cp): (Score, Score)) {
    eprintln!(
        "{what} {}: talker shortfall {:.4} nats, agreement {:.3}; code predictor shortfall {:.4} nats, agreement {:.3}",
        bounds.format, talker.shortfall, talker.agreement, cp.shortfall, cp.agreement
    );
    for (stage, got, bound) in [
        ("talker", talker, bounds.talker),
        ("code predictor", cp, bounds.code_predictor),
    ] {
        assert!(
            got.shortfall <= bound.shortfall && got.agreement >= bound.agreement,
            "{what} {} {stage}: shortfall {:.4} nats (bound {}), agreement {:.3} (bound {})",
            bounds.format,
            got.shortfall,
            bound.shortfall,
            got.agreement,
            bound.agreement
        );
    }
}

/// The first golden run's request of a fixture.
fn fixture_request(case: &str) -> PromptRequest {
    request(&runs(case)[0])
}

fn bound(format: WeightFormat, talker: Score, code_predictor: Score) -> Bounds {
    Bounds {
        format,
        talker,
        code_predictor,
    }
}

fn s(shortfall: f64, agreement: f64) -> Score {
    Score {
        shortfall,
        agreement,
    }
}

/// The tiny committed models (hidden 32; the 1.7B shape has the code predictor's projection), 32 frames.
#[test]
fn tiny_fixtures() {
    const FRAMES: usize = 32;
    // Bounds from one measured run (x86-64 AVX2, 1 thread), then a margin: the shortfall at most twice the
    // measured value (at least 0.005 nats), the agreement 0.1 below it (3 of the talker's 32 positions).
    // Measured: shape_0b6 q8_0 talker 0.0000 nats / 1.000, code predictor 0.0002 / 0.981; q4_0 0.0396 / 0.750,
    // 0.0338 / 0.804. shape_1b7 q8_0 0.0000 / 1.000, 0.0002 / 0.979; q4_0 0.0119 / 0.750, 0.0621 / 0.733.
    let cases = [
        (
            "shape_0b6",
            [
                bound(WeightFormat::Q8_0, s(0.005, 0.90), s(0.005, 0.88)),
                bound(WeightFormat::Q4_0, s(0.08, 0.65), s(0.07, 0.70)),
            ],
        ),
        (
            "shape_1b7",
            [
                bound(WeightFormat::Q8_0, s(0.005, 0.90), s(0.005, 0.88)),
                bound(WeightFormat::Q4_0, s(0.025, 0.65), s(0.125, 0.63)),
            ],
        ),
    ];
    let load = |case, format| model_as(case, format, 1);
    for (case, bounds) in &cases {
        let request = fixture_request(case);
        let f32_model = load(case, WeightFormat::F32);
        let prompt = f32_model.prompt(&request).unwrap();
        let reference = trace(&f32_model, &prompt, FRAMES, None);
        // The metric itself: f32 against itself is exact.
        let (t, cp) = compare(&reference, &f32_model, &prompt);
        assert!(t.shortfall == 0.0 && t.agreement == 1.0, "{case}: {t:?}");
        assert!(cp.shortfall == 0.0 && cp.agreement == 1.0, "{case}: {cp:?}");
        for b in bounds {
            let model = load(case, b.format);
            let prompt = model.prompt(&request).unwrap();
            check(case, b, compare(&reference, &model, &prompt));
        }
    }
}

/// Random weights of the released 0.6B shapes (the bench's), 32 frames on 2 threads; as a control, a q4_0
/// model of other random weights must fail the q4_0 bounds (the metric tells models apart).
#[test]
#[ignore = "real-size model: 2.6 GB and 2.5 min of CPU; run with --ignored"]
fn released_0b6_shapes_on_random_weights() {
    const FRAMES: usize = 32;
    // Bounds from one measured run (x86-64 AVX2, 2 threads), with the tiny test's margin: the shortfall at most
    // twice the measured value (at least 0.005 nats), the agreement 0.1 below it. Measured: q8_0 talker
    // 0.0001 nats / 0.969, code predictor 0.0013 / 0.948; q4_0 0.1858 / 0.406, 0.3076 / 0.406 (random weights
    // give flat distributions, so small changes flip many greedy choices, at little cost in log-probability);
    // the control, other weights: 3.08 / 0.0 and 3.57 / 0.0. With int8 activations for both formats (AVX512-VNNI,
    // Xeon, 2 threads): q8_0 0.0006 / 0.938, 0.0010 / 0.956; q4_0 0.0882 / 0.594, 0.0916 / 0.604.
    let bounds = [
        bound(WeightFormat::Q8_0, s(0.005, 0.87), s(0.005, 0.85)),
        bound(WeightFormat::Q4_0, s(0.37, 0.30), s(0.62, 0.30)),
    ];
    let load = |seed, format| {
        TtsModel::from_parts(
            ModelConfig::released("0.6b").unwrap(),
            GenerationConfig::default(),
            &RandomWeights::new(seed),
            LmBackends::same(Arc::new(CpuBackend::new(2))),
            WeightStorage::Convert(format),
        )
        .unwrap()
    };
    // The bench's request: 3 role ids, 13 text ids, 5 closing ids; speaker ryan.
    let mut ids = vec![151644, 77091, 198];
    ids.extend((0..13).map(|i| 1000 + 37 * i));
    ids.extend([151645, 198, 151644, 77091, 198]);
    let request = PromptRequest {
        input_ids: ids,
        instruct_ids: None,
        speaker: Some("ryan".into()),
        language: "english".into(),
        non_streaming_mode: true,
    };
    let reference = {
        let model = load(0x5eed, WeightFormat::F32);
        let prompt = model.prompt(&request).unwrap();
        trace(&model, &prompt, FRAMES, None)
    };
    for b in &bounds {
        let model = load(0x5eed, b.format);
        let prompt = model.prompt(&request).unwrap();
        check("random 0.6b", b, compare(&reference, &model, &prompt));
    }
    let other = load(0x0dd, WeightFormat::Q4_0);
    let prompt = other.prompt(&request).unwrap();
    let (t, cp) = compare(&reference, &other, &prompt);
    eprintln!("control (other weights, q4_0): talker {t:?}, code predictor {cp:?}");
    let q4 = &bounds[1];
    assert!(
        t.shortfall > q4.talker.shortfall && cp.shortfall > q4.code_predictor.shortfall,
        "other weights pass as q4_0: talker {t:?}, code predictor {cp:?}"
    );
}
