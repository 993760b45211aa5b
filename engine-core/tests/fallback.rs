//! A backend that fails at run time: the real `faulty` test plugin (`tests/faulty-plugin`, dlopen'ed) runs one
//! stage and fails after a set number of op lists; the stage moves to the CPU with one warning, and the
//! utterance is still the official waveform (the committed golden of the fixture), neither cut nor repeated.

use std::sync::{Arc, Mutex};

use kazeia_engine::fallback::Stage;
use kazeia_engine::graph::Graph;
use kazeia_engine::lm::LmBackends;
use kazeia_engine::plugins::{inspect, PluginBackend};
use kazeia_engine::stream::{SessionControl, StreamConfig};
use kazeia_engine::synth::{SynthOptions, Synthesizer};
use kazeia_engine::{Backend, CpuBackend, Error, WeightStorage};

#[path = "it/common/mod.rs"]
#[allow(dead_code)] // this binary uses a few of the engine tests' helpers
mod common;

use common::lm_fixtures::ryan;
use common::{assert_within, chunking};

/// The fixture every test here speaks with.
const CASE: &str = "shape_0b6";

fn fixture() -> std::path::PathBuf {
    common::lm_fixtures::fixture(CASE)
}

/// A synthesizer with `stage` on a faulty backend that runs `after` lists, the others on the built-in CPU
/// backend; and the warnings it logs.
fn synthesizer(stage: Stage, after: usize) -> (Synthesizer, Arc<Mutex<Vec<String>>>) {
    // The plugin reads its budget when a backend is created (one test at a time uses it: see below).
    std::env::set_var("KAZEIA_FAULTY_AFTER", after.to_string());
    let info = inspect(&kazeia_tests::faulty_plugin());
    assert!(info.is_available(), "{:?}", info.unavailable);
    let faulty: Arc<dyn Backend> = Arc::new(PluginBackend::create(&info, 0, 2).unwrap());
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new(2));
    let on = |s: Stage| {
        if s == stage {
            faulty.clone()
        } else {
            cpu.clone()
        }
    };
    let lm = LmBackends {
        talker: on(Stage::Talker),
        code_predictor: on(Stage::CodePredictor),
    };
    let mut synth =
        Synthesizer::load_on(&fixture(), lm, on(Stage::Decoder), WeightStorage::AsStored).unwrap();
    let warnings = Arc::new(Mutex::new(Vec::new()));
    let log = warnings.clone();
    synth.fallback.set_log(Box::new(move |stage, why| {
        log.lock().unwrap().push(format!("{}: {why}", stage.name()))
    }));
    (synth, warnings)
}

/// Speaks `text` greedily in chunks of up to `chunk_chars` characters: the number of chunks spoken, and the
/// audio.
fn speak_text(
    synth: &Synthesizer,
    text: &str,
    chunk_chars: usize,
    config: StreamConfig,
) -> Result<(usize, Vec<f32>), Error> {
    let mut audio = Vec::new();
    let options = SynthOptions {
        greedy: true,
        seed: None,
        max_new_tokens: Some(24),
        chunk_chars,
        text_budget: true,
        ignore_eos: false,
    };
    let (report, _) = synth.synthesize(
        text,
        &ryan(None),
        &options,
        config,
        &SessionControl::new(),
        &mut |chunk| {
            audio.extend_from_slice(chunk);
            Ok(())
        },
    )?;
    Ok((report.utterances, audio))
}

/// Speaks the fixture's English sentence, the one its golden waveform is of: the audio.
fn speak(synth: &Synthesizer, config: StreamConfig) -> Result<Vec<f32>, Error> {
    speak_text(synth, "Hello world.", 400, config).map(|(_, audio)| audio)
}

fn assert_official(audio: &[f32], what: &str) {
    assert_within(what, audio, &common::lm_fixtures::golden_wav(CASE), 1e-4);
}

/// The plugin's budget is one per process: one test at a time sets it.
static PLUGIN: Mutex<()> = Mutex::new(());

#[test]
fn a_stage_whose_backend_fails_moves_to_the_cpu_and_the_utterance_is_still_the_official_one() {
    let _one = PLUGIN.lock().unwrap_or_else(|e| e.into_inner());
    let cache = tempfile::tempdir().unwrap();
    std::env::set_var("KAZEIA_CACHE_DIR", cache.path());
    let config = chunking(1, 4, 1);
    // Lists each stage runs before its failure: the talker's prompt takes 5 and its prefill 1, so 8 fails
    // in the second frame; the code predictor runs 15 a frame; the decoder one per chunk, three for the first
    // (the stages before the vocoder, then its two parts: 2 fails after the first part was heard, which is not
    // heard twice). 0: the very first.
    let cases = [
        (Stage::Talker, 0),
        (Stage::Talker, 8),
        (Stage::CodePredictor, 0),
        (Stage::CodePredictor, 37),
        (Stage::Decoder, 0),
        (Stage::Decoder, 2),
        (Stage::Decoder, 4),
    ];
    for (stage, after) in cases {
        let what = format!("{} failing after {after} lists", stage.name());
        let (synth, warnings) = synthesizer(stage, after);
        let audio = speak(&synth, config).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_official(&audio, &what);
        let logged = warnings.lock().unwrap().clone();
        assert_eq!(logged.len(), 1, "{what}: one warning: {logged:?}");
        assert!(
            logged[0].starts_with(stage.name()) && logged[0].contains("injected fault"),
            "{what}: {logged:?}"
        );
        let moved = synth.fallback.moved();
        assert_eq!(moved.len(), 1, "{what}: {moved:?}");
        assert_eq!(moved[0].0, stage);
        for other in Stage::ALL.into_iter().filter(|&s| s != stage) {
            assert!(!synth.fallback.has_moved(other), "{what}: {other:?} moved");
        }
        // The next utterance runs on the CPU copy from the start: the same audio, no new warning.
        assert_official(&speak(&synth, config).unwrap(), &format!("{what}, again"));
        assert_eq!(warnings.lock().unwrap().len(), 1, "{what}: warned again");
    }
    // A backend that works is never replaced.
    let (synth, warnings) = synthesizer(Stage::Decoder, usize::MAX);
    assert_official(&speak(&synth, config).unwrap(), "a working plugin");
    assert!(warnings.lock().unwrap().is_empty());
    assert!(synth.fallback.moved().is_empty());
}

#[test]
fn a_failing_backend_is_an_error_value_of_the_graph_and_nothing_runs_after_it() {
    let _one = PLUGIN.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("KAZEIA_FAULTY_AFTER", "1");
    let info = inspect(&kazeia_tests::faulty_plugin());
    let faulty = PluginBackend::create(&info, 0, 1).unwrap();
    let mut g = Graph::new(&faulty);
    let x = g.input(vec![1.0, -2.0]);
    g.gelu(&x);
    let once = g.read(&x).unwrap()[1];
    assert!((-0.05..-0.04).contains(&once), "gelu(-2) = {once}");
    g.gelu(&x);
    match g.read(&x) {
        Err(Error::Backend { backend, message }) => {
            assert_eq!(backend, "faulty");
            assert!(message.contains("injected fault: list 2"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // Kept: later ops do not run (no third list reaches the plugin), and the end says so too.
    g.silu(&x);
    assert!(matches!(g.take(x), Err(Error::Backend { .. })));
    assert_eq!(g.flushes(), 2);
    assert!(matches!(g.finish(), Err(Error::Backend { .. })));
}

/// A backend that cannot hold weights (a device out of memory): the engine keeps each refused weight on its CPU
/// (warned once) and runs the ops on it there, between the plugin's lists; the utterance is still the official
/// one. A weight the CPU cannot hold either (inconsistent data) is an error value of the load.
#[test]
fn weights_a_backend_refuses_stay_on_the_cpu_and_the_utterance_is_the_official_one() {
    let _one = PLUGIN.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("KAZEIA_FAULTY_AFTER", "100000");
    std::env::set_var("KAZEIA_FAULTY_REFUSE_WEIGHTS", "1");
    let info = inspect(&kazeia_tests::faulty_plugin());
    let faulty = Arc::new(PluginBackend::create(&info, 0, 2).unwrap());
    let backend: Arc<dyn Backend> = faulty.clone();
    let synth = Synthesizer::load_on(
        &fixture(),
        LmBackends::same(backend.clone()),
        backend.clone(),
        WeightStorage::AsStored,
    );
    let bad = backend.upload(kazeia_backend_abi::WeightData::Linear {
        w: &[1.0; 6],
        out: 2,
        inp: 4,
        bias: None,
        format: kazeia_engine::WeightFormat::F32,
    });
    std::env::remove_var("KAZEIA_FAULTY_REFUSE_WEIGHTS");
    let synth = synth.expect("loads with its weights on the CPU");
    assert!(faulty.host_weights() > 0, "the weights went to the CPU");
    assert_official(
        &speak(&synth, StreamConfig::default()).unwrap(),
        "weights held on the CPU",
    );
    assert!(synth.fallback.moved().is_empty(), "no stage had to move");
    match bad {
        Err(message) => {
            assert!(message.contains("out of device memory"), "{message}");
            assert!(message.contains("nor could the CPU hold it"), "{message}");
        }
        Ok(_) => panic!("an inconsistent weight was uploaded"),
    }
}

/// A batched session (`StreamConfig::batch`) whose talker or code predictor fails mid-batch: the stage moves
/// to the CPU, every live chunk's work is redone there, and the text's audio is what a sequential session
/// on the CPU gives (greedy), neither cut nor repeated.
#[test]
fn a_stage_failing_mid_batch_moves_to_the_cpu_and_no_chunk_is_lost() {
    let _one = PLUGIN.lock().unwrap_or_else(|e| e.into_inner());
    let cache = tempfile::tempdir().unwrap();
    std::env::set_var("KAZEIA_CACHE_DIR", cache.path());
    let text = "Hello world. Good morning, how are you today? Fine, thanks.";
    let speak =
        |synth: &Synthesizer, batch: usize| speak_text(synth, text, 16, chunking(1, 4, batch));
    let cpu = Synthesizer::load(&fixture(), Arc::new(CpuBackend::new(2))).unwrap();
    let (chunks, reference) = speak(&cpu, 1).unwrap();
    assert!(chunks >= 3, "{chunks} chunks");
    // Failing in a prefill, in a batched step, and later.
    for (stage, after) in [
        (Stage::Talker, 0),
        (Stage::Talker, 12),
        (Stage::Talker, 40),
        (Stage::CodePredictor, 0),
        (Stage::CodePredictor, 50),
        (Stage::CodePredictor, 200),
    ] {
        let what = format!("{} failing after {after} lists", stage.name());
        let (synth, warnings) = synthesizer(stage, after);
        let (_, audio) = speak(&synth, 3).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_within(&what, &audio, &reference, 1e-4);
        assert_eq!(warnings.lock().unwrap().len(), 1, "{what}: one warning");
        assert!(synth.fallback.has_moved(stage), "{what}: moved");
    }
}
