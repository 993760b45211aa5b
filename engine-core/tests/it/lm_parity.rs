//! Text → codes against the official implementation (`tests/fixtures/lm/*`, made by `tools/make_fixtures.py`):
//! greedy codes must be identical for every prompt layout, in both model shapes; the prefill and first-frame
//! intermediates are compared first so a failure points at the component.

use crate::common;

use std::sync::Arc;

use common::lm_fixtures::{
    fixture, golden_codes, greedy_codes, ids, max_new_tokens, model_as, request, runs, CASES,
};

use crate::common::max_abs_diff;
use kazeia_engine::lm::sampler::{argmax, TalkerRules};
use kazeia_engine::lm::TtsModel;
use kazeia_engine::tokenizer::{assistant_text, instruct_text, TextTokenizer};
use kazeia_engine::weights::WeightFile;
use kazeia_engine::CpuBackend;

fn assert_close(case: &str, what: &str, ours: &[f32], reference: &[f32]) {
    let peak = reference.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let err = max_abs_diff(ours, reference);
    assert!(
        err <= 1e-4 * peak.max(1.0),
        "{case}: {what} differs by {err:e} (peak {peak})"
    );
}

#[test]
fn prefill_and_first_frame_intermediates_match_official() {
    for case in CASES {
        let model = TtsModel::load(&fixture(case), Arc::new(CpuBackend::new(1))).unwrap();
        let golden = WeightFile::open(&fixture(case).join("golden.safetensors")).unwrap();
        let run = &runs(case)[0];
        let prompt = model.prompt(&request(run)).unwrap();
        assert_close(
            case,
            "prefill embeddings",
            &prompt.embeds,
            &golden.tensor("prefill_embeds").unwrap().data,
        );

        let backend = model.backend.as_ref();
        let mut cache = model.talker.new_cache(prompt.rows + 1);
        let hidden = model
            .talker
            .forward_all(backend, &prompt.embeds, prompt.rows, &mut cache)
            .unwrap();
        assert_close(
            case,
            "prefill hidden states",
            &hidden,
            &golden.tensor("prefill_hidden").unwrap().data,
        );

        let mut cache = model.talker.new_cache(prompt.rows + 1);
        let (last, mut logits) = model
            .talker
            .forward(backend, &prompt.embeds, prompt.rows, &mut cache)
            .unwrap();
        assert_close(
            case,
            "first talker logits",
            &logits,
            &golden.tensor("first_logits").unwrap().data,
        );

        let t = &model.config.talker_config;
        let rules = TalkerRules {
            repetition_penalty: 1.05,
            min_new_tokens: 2,
            eos: t.codec_eos_token_id,
            suppress: (t.vocab_size - 1024, t.vocab_size),
        };
        rules.apply(&mut logits, &[]);
        let cb0 = argmax(&logits);
        assert_eq!(
            cb0 as u64,
            run["codes"][0][0].as_u64().unwrap(),
            "{case}: first codebook-0 token"
        );
        let mut cp_logits = Vec::new();
        let mut cp_cache = model.code_predictor.new_cache();
        model
            .code_predictor
            .predict(
                backend,
                &last,
                model.talker.codec_vector(cb0),
                &mut cp_cache,
                &mut |_, l| {
                    cp_logits.extend_from_slice(l);
                    argmax(l)
                },
            )
            .unwrap();
        assert_close(
            case,
            "first-frame code-predictor logits",
            &cp_logits,
            &golden.tensor("cp_logits_frame0").unwrap().data,
        );
    }
}

#[test]
fn greedy_codes_are_identical_to_official_for_every_layout() {
    let mut checked = 0;
    for case in CASES {
        let model = TtsModel::load(&fixture(case), Arc::new(CpuBackend::new(1))).unwrap();
        for run in runs(case) {
            let name = run["name"].as_str().unwrap();
            let codes = greedy_codes(&model, &run, max_new_tokens(&run));
            let expected = golden_codes(&run);
            assert_eq!(codes, expected, "{case}/{name}: codes differ");
            checked += 1;
        }
    }
    assert!(checked >= 16);
}

#[test]
fn tokenizing_the_run_texts_gives_the_official_template_ids() {
    for case in CASES {
        let tok = TextTokenizer::load(&fixture(case)).unwrap();
        for run in runs(case) {
            let text = run["text"].as_str().unwrap();
            assert_eq!(
                tok.encode(&assistant_text(text)).unwrap(),
                ids(&run["input_ids"]),
                "{text}"
            );
            if let Some(instruct) = run["instruct"].as_str().filter(|s| !s.is_empty()) {
                assert_eq!(
                    tok.encode(&instruct_text(instruct)).unwrap(),
                    ids(&run["instruct_ids"])
                );
            }
        }
    }
}

#[test]
fn bad_requests_are_rejected_with_a_reason() {
    let model = TtsModel::load(&fixture("shape_0b6"), Arc::new(CpuBackend::new(1))).unwrap();
    let run = &runs("shape_0b6")[0];
    let mut req = request(run);
    req.speaker = Some("nobody".into());
    let err = model.prompt(&req).err().unwrap().to_string();
    assert!(
        err.contains("unknown speaker `nobody`") && err.contains("ryan"),
        "{err}"
    );
    let mut req = request(run);
    req.language = "klingon".into();
    let err = model.prompt(&req).err().unwrap().to_string();
    assert!(err.contains("unknown language `klingon`"), "{err}");
    let mut req = request(run);
    req.input_ids.truncate(8);
    let err = model.prompt(&req).err().unwrap().to_string();
    assert!(err.contains("at least 9"), "{err}");
    let mut req = request(run);
    req.input_ids[4] = 1_000_000;
    let err = model.prompt(&req).err().unwrap().to_string();
    assert!(err.contains("outside the model's text vocabulary"), "{err}");
}

/// F32, and BF16 storage of the BF16 checkpoints, are lossless: the codes stay identical (the default keeps the
/// checkpoint's own precision). F16 gives the same codes on these fixtures too (measured: 8/8 runs of each).
/// The lossy formats (Q8_0, Q4_0) cannot be held to identical free-running codes, which diverge after the first
/// differing choice; `lossy_formats.rs` checks them teacher-forced against f32, with bounds.
#[test]
fn weight_formats_against_f32_codes() {
    use kazeia_engine::WeightFormat;
    for case in CASES {
        for format in [WeightFormat::F32, WeightFormat::BF16, WeightFormat::F16] {
            let model = model_as(case, format, 1);
            for run in &runs(case) {
                let codes = greedy_codes(&model, run, max_new_tokens(run));
                let expected = golden_codes(run);
                assert_eq!(codes, expected, "{case} {format}: {}", run["name"]);
            }
        }
    }
}

/// The converted-weight cache: a second load maps what the first one wrote and behaves identically; a cache
/// file that is damaged is ignored and rewritten.
#[test]
fn converted_weights_are_cached_on_disk() {
    use kazeia_engine::lm::LmBackends;
    use kazeia_engine::{WeightFormat, WeightStorage};
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture("shape_1b7");
    let run = &runs("shape_1b7")[4];
    let storage = WeightStorage::Convert(WeightFormat::Q8_0);
    let load = || {
        let backends = LmBackends::same(Arc::new(CpuBackend::new(1)));
        TtsModel::load_cached(&dir, backends, storage, Some(tmp.path())).unwrap()
    };
    let codes_of = |model: &TtsModel| greedy_codes(model, run, 12);
    let first = codes_of(&load());
    let files: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "one cache file: {files:?}");
    let written = std::fs::metadata(&files[0]).unwrap().modified().unwrap();
    assert_eq!(codes_of(&load()), first, "warm cache");
    assert_eq!(
        std::fs::metadata(&files[0]).unwrap().modified().unwrap(),
        written,
        "a warm load rewrote it"
    );
    // Damage it: the next load ignores it, gives the same codes, and writes a good one.
    let bytes = std::fs::read(&files[0]).unwrap();
    std::fs::write(&files[0], &bytes[..bytes.len() / 2]).unwrap();
    assert_eq!(codes_of(&load()), first, "damaged cache");
    assert_eq!(std::fs::read(&files[0]).unwrap(), bytes, "rewritten whole");
}

/// The talker on the dlopen'ed CPU plugin, the code predictor on the built-in backend (stages may differ): the
/// official greedy codes still come out.
#[test]
fn greedy_codes_through_the_plugin_are_the_official_ones() {
    use kazeia_engine::lm::LmBackends;
    use kazeia_engine::plugins::{inspect, PluginBackend};
    use kazeia_engine::WeightStorage;
    let info = inspect(&kazeia_tests::cpu_plugin());
    let backends = LmBackends {
        talker: Arc::new(PluginBackend::create(&info, 0, 1).unwrap()),
        code_predictor: Arc::new(CpuBackend::new(1)),
    };
    let model =
        TtsModel::load_on(&fixture("shape_1b7"), backends, WeightStorage::AsStored).unwrap();
    for run in runs("shape_1b7") {
        let codes = greedy_codes(&model, &run, max_new_tokens(&run));
        let expected = golden_codes(&run);
        assert_eq!(codes, expected, "{}", run["name"]);
    }
}
