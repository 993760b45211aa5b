//! The codec decoder and the language models with their stages on the Vulkan plugin, against the CPU backend and
//! the official golden outputs (`tests/fixtures`).

use crate::common::codec::{codec_codes as codes, golden_wav, max_abs_diff, snr_db};
use crate::common::{fixtures, greedy_codes, greedy_from, ids, prompt_of, runs};

use std::path::Path;
use std::sync::Arc;

use kazeia_backend_abi::Backend;
use kazeia_backend_vulkan::{Options, Stats, VulkanBackend};
use kazeia_engine::codec::CodecDecoder;
use kazeia_engine::lm::{LmBackends, TtsModel};
use kazeia_engine::plugins::{inspect, PluginBackend};
use kazeia_engine::{CpuBackend, WeightFormat, WeightStorage};

/// The bound for the decoder on Vulkan against the CPU, f32.
const TOLERANCE: f32 = 1e-3;

fn vulkan_plugin_backend() -> Arc<dyn Backend> {
    let info = inspect(&kazeia_tests::vulkan_plugin());
    assert!(info.is_available(), "{:?}", info.unavailable);
    Arc::new(PluginBackend::create(&info, 0, 1).unwrap())
}

fn cpu_wav(dir: &Path) -> Vec<f32> {
    CodecDecoder::load(dir, Arc::new(CpuBackend::new(1)))
        .unwrap()
        .decode(&codes(dir))
        .unwrap()
}

#[test]
fn the_decoder_on_the_vulkan_plugin_matches_the_cpu_on_every_fixture() {
    let vulkan = vulkan_plugin_backend();
    for case in ["window", "rates", "bf16_gqa", "long"] {
        let dir = fixtures().join("codec").join(case);
        let decoder = CodecDecoder::load(&dir, vulkan.clone()).unwrap();
        let t = std::time::Instant::now();
        let wav = decoder.decode(&codes(&dir)).unwrap();
        let elapsed = t.elapsed();
        let vs_cpu = max_abs_diff(&wav, &cpu_wav(&dir));
        let vs_golden = max_abs_diff(&wav, &golden_wav(&dir));
        eprintln!(
            "{case}: {} samples in {elapsed:.2?}; max abs error vs cpu {vs_cpu:e}, vs official {vs_golden:e}",
            wav.len()
        );
        assert!(vs_cpu <= TOLERANCE, "{case}: {vs_cpu:e} from the CPU");
        assert!(
            vs_golden <= TOLERANCE,
            "{case}: {vs_golden:e} from the official output"
        );
    }
}

#[test]
fn chunked_decoding_on_vulkan_equals_one_shot() {
    // The streaming path: the first chunk of one frame, then chunks of eight, state carried between them.
    let vulkan = vulkan_plugin_backend();
    let dir = fixtures().join("codec/rates");
    let decoder = CodecDecoder::load(&dir, vulkan).unwrap();
    let codes = codes(&dir);
    let one_shot = decoder.decode(&codes).unwrap();
    let mut state = decoder.new_state();
    let mut chunked = Vec::new();
    let mut at = 0;
    for size in std::iter::once(1).chain(std::iter::repeat(8)) {
        if at >= codes.len() {
            break;
        }
        let end = (at + size).min(codes.len());
        chunked.extend(decoder.decode_chunk(&mut state, &codes[at..end]).unwrap());
        at = end;
    }
    let err = max_abs_diff(&chunked, &one_shot);
    eprintln!("chunked vs one-shot on vulkan: {err:e}");
    assert!(err <= 1e-5, "{err:e}");
}

/// A codec fixture's codes decoded on the Vulkan backend in-process, with the plugin's `options`.
fn decode_in_process(dir: &Path, options: Options) -> Vec<f32> {
    let backend = VulkanBackend::new(0, 1, options).unwrap();
    CodecDecoder::load(dir, Arc::new(backend))
        .unwrap()
        .decode(&codes(dir))
        .unwrap()
}

#[test]
fn the_decoder_with_f16_convolutions_and_with_shared_memory_reductions() {
    // In-process, with the plugin's options: F16 convolution weights (reported: SNR and error against the
    // official f32 output), and the reductions without subgroup operations (as on a device without them).
    for case in ["window", "rates"] {
        let dir = fixtures().join("codec").join(case);
        let golden = golden_wav(&dir);
        let f16 = Options {
            conv_f16: true,
            ..Options::default()
        };
        let wav = decode_in_process(&dir, f16);
        let snr = snr_db(&golden, &wav);
        eprintln!(
            "{case}: F16 convolution weights: SNR {snr:.1} dB, max abs error {:e} vs the official f32 output",
            max_abs_diff(&wav, &golden)
        );
        assert!(snr >= 30.0, "{case}: {snr:.1} dB");

        let shared = Options {
            subgroups: Some(false),
            ..Options::default()
        };
        let wav = decode_in_process(&dir, shared);
        let err = max_abs_diff(&wav, &cpu_wav(&dir));
        assert!(
            err <= TOLERANCE,
            "{case}, shared-memory reductions: {err:e}"
        );
    }
}

#[test]
fn decoding_again_replays_the_recorded_command_buffers() {
    let backend = Arc::new(VulkanBackend::new(0, 1, Options::default()).unwrap());
    let dir = fixtures().join("codec/window");
    let decoder = CodecDecoder::load(&dir, backend.clone()).unwrap();
    let codes = codes(&dir);
    let first = decoder.decode(&codes).unwrap();
    let after_first = backend.stats();
    let second = decoder.decode(&codes).unwrap();
    let after_second = backend.stats();
    assert_eq!(first, second);
    let submits = after_second.submits - after_first.submits;
    eprintln!(
        "one decode: {submits} submissions, {} dispatches",
        after_second.dispatches - after_first.dispatches
    );
    assert_eq!(submits, 1, "a one-shot decode is one list");
    assert_eq!(
        after_second.recorded, after_first.recorded,
        "nothing recorded again"
    );
    assert_eq!(after_second.replayed - after_first.replayed, submits);
}

#[test]
fn talker_and_code_predictor_on_vulkan_give_the_official_greedy_codes() {
    // Both LM stages on the plugin: F32 storage gives the official codes; F16 and BF16 (matvec kinds of the
    // token steps) give exactly the CPU backend's codes in the same format. (Q8_0 and Q4_0 differ from the CPU
    // by its int8 activations; `kernels.rs` compares their layers with the dequantised weights.)
    let vulkan = vulkan_plugin_backend();
    let backends = || LmBackends {
        talker: vulkan.clone(),
        code_predictor: vulkan.clone(),
    };
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new(1));
    let case = "shape_0b6";
    let dir = fixtures().join("lm").join(case);
    let official =
        TtsModel::load_on(&dir, backends(), WeightStorage::Convert(WeightFormat::F32)).unwrap();
    for run in runs(case) {
        let expected: Vec<Vec<u32>> = run["codes"].as_array().unwrap().iter().map(ids).collect();
        assert_eq!(
            greedy_codes(&official, &run),
            expected,
            "f32: {}",
            run["name"]
        );
    }
    for format in [WeightFormat::F16, WeightFormat::BF16] {
        let on_vulkan =
            TtsModel::load_on(&dir, backends(), WeightStorage::Convert(format)).unwrap();
        let on_cpu = TtsModel::load_on(
            &dir,
            LmBackends {
                talker: cpu.clone(),
                code_predictor: cpu.clone(),
            },
            WeightStorage::Convert(format),
        )
        .unwrap();
        for run in runs(case) {
            assert_eq!(
                greedy_codes(&on_vulkan, &run),
                greedy_codes(&on_cpu, &run),
                "{format}: {}",
                run["name"]
            );
        }
    }
}

#[test]
fn a_decoder_chunk_is_one_submission_and_later_chunks_replay_it() {
    // The streaming decode: every chunk is one list, so one submission and one wait; once the attention window
    // is full, chunks of the same size have the same structure and replay the recorded command buffer.
    let dir = fixtures().join("codec/window");
    let vulkan = Arc::new(VulkanBackend::new(0, 1, Options::default()).unwrap());
    let decoder = CodecDecoder::load(&dir, vulkan.clone()).unwrap();
    let codes = codes(&dir);
    let cpu = cpu_wav(&dir);
    let mut state = decoder.new_state();
    let mut wav = Vec::new();
    for (i, chunk) in codes.chunks(2).enumerate() {
        let before = vulkan.stats();
        wav.extend(decoder.decode_chunk(&mut state, chunk).unwrap());
        let after = vulkan.stats();
        let (submits, recorded) = (
            after.submits - before.submits,
            after.recorded - before.recorded,
        );
        let down = after.downloaded - before.downloaded;
        if i < 5 {
            eprintln!(
                "chunk {i}: {submits} submission(s), {} dispatches, {recorded} recorded, {} bytes up, {down} down",
                after.dispatches - before.dispatches,
                after.uploaded - before.uploaded
            );
        }
        assert_eq!(submits, 1, "chunk {i}: {submits} submissions");
        // Up go the codes' embeddings, the carried state and per-channel constants; buffers the chunk fills
        // in part are set on the device (Fill), not uploaded as zeros. Down come the samples and the state.
        let up = after.uploaded - before.uploaded;
        assert!(up < 2 * down, "chunk {i}: {up} bytes up for {down} down");
        // Windows of 4 positions keep 3: from the fourth chunk of 2 frames on, the window is full.
        if i >= 3 {
            assert_eq!(
                recorded, 0,
                "chunk {i} was recorded again instead of replayed"
            );
        }
    }
    let err = max_abs_diff(&wav, &cpu);
    eprintln!("chunks of 2 frames on vulkan vs the cpu's one-shot decode: {err:e}");
    assert!(err <= TOLERANCE, "{err:e}");
}

/// Greedy codes of the first `shape_0b6` run with both LM stages on `vulkan`, with the stats of the generation
/// (the prompt excluded).
fn greedy_on(vulkan: &Arc<VulkanBackend>) -> (Vec<Vec<u32>>, Stats, Stats) {
    let backends = LmBackends {
        talker: vulkan.clone(),
        code_predictor: vulkan.clone(),
    };
    let case = "shape_0b6";
    let dir = fixtures().join("lm").join(case);
    let model =
        TtsModel::load_on(&dir, backends, WeightStorage::Convert(WeightFormat::F32)).unwrap();
    let run = &runs(case)[0];
    let prompt = prompt_of(&model, run);
    let before = vulkan.stats();
    let codes = greedy_from(&model, &prompt, run);
    let after = vulkan.stats();
    let expected: Vec<Vec<u32>> = run["codes"].as_array().unwrap().iter().map(ids).collect();
    assert_eq!(codes, expected, "{}", run["name"]);
    (codes, before, after)
}

#[test]
fn each_token_step_is_one_submission_with_its_kv_cache_resident() {
    // A talker step (stack and codec head) and a code-predictor step (projection, stack and head) are each one
    // list: one submission, where the host only samples and looks up embeddings between them. The KV caches stay
    // on the device between steps (Resident): against the same generation with them uploaded every step.
    let vulkan = Arc::new(VulkanBackend::new(0, 1, Options::default()).unwrap());
    let (codes, before, after) = greedy_on(&vulkan);
    let frames = codes.len();
    let steps = codes[0].len() - 1;
    let submits = after.submits - before.submits;
    let (up, down) = (
        after.uploaded - before.uploaded,
        after.downloaded - before.downloaded,
    );
    eprintln!(
        "{frames} frames: {submits} submissions, {} dispatches, {} recorded, {} replayed; {up} bytes uploaded, \
         {down} downloaded",
        after.dispatches - before.dispatches,
        after.recorded - before.recorded,
        after.replayed - before.replayed
    );
    // The prefill (the first frame's talker step: on a fresh model two lists, the voice's fixed prompt rows,
    // kept for later prompts, then the text's rows) and one talker step per later frame (the step after the last
    // frame runs too unless the frame budget ends generation), one code-predictor step per further codebook.
    let talker = submits - (frames * steps) as u64 - 1;
    assert!(
        talker == frames as u64 || talker == frames as u64 + 1,
        "{submits} submissions for {frames} frames of {steps} code-predictor steps"
    );

    let uploading = Arc::new(
        VulkanBackend::new(
            0,
            1,
            Options {
                resident_mb: 0,
                ..Options::default()
            },
        )
        .unwrap(),
    );
    let (_, before, after) = greedy_on(&uploading);
    let (up_all, down_all) = (
        after.uploaded - before.uploaded,
        after.downloaded - before.downloaded,
    );
    eprintln!(
        "with the KV caches uploaded every step: {up_all} bytes uploaded, {down_all} downloaded"
    );
    // Every step used to upload the KV prefix it reads; resident, only the rows it has not seen go up.
    assert!(
        up * 2 < up_all,
        "{up} bytes uploaded resident, {up_all} not"
    );
    // Either way only what the host reads comes back: the logits, the last hidden state, the appended KV rows
    // (dead intermediate results are discarded, the unchanged KV prefix is not copied back).
    assert_eq!(down, down_all);
    assert!(
        down * 2 < up_all,
        "{down} bytes downloaded for {up_all} uploaded"
    );
}

#[test]
fn through_the_plugin_table_vulkan_and_the_cpu_plugin_take_lists_and_only_vulkan_is_a_device() {
    // The engine asks the plugin's `capabilities`: both take whole stages as lists (Vulkan: one submission;
    // the CPU: one hand-off to its threads), and only Vulkan's memory is a device's, so only its lists may
    // hold many intermediate results (the CPU's are kept small in bytes, as its memory is the host's).
    let vulkan = vulkan_plugin_backend().capabilities();
    assert!(vulkan.lists() && vulkan.device());
    let cpu = inspect(&kazeia_tests::cpu_plugin());
    assert!(cpu.is_available(), "{:?}", cpu.unavailable);
    let cpu = PluginBackend::create(&cpu, 0, 1).unwrap().capabilities();
    assert!(cpu.lists() && !cpu.device());
}
