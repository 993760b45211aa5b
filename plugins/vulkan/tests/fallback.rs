//! Ops the plugin does not take, through the plugin table: the engine asks `supports`, hands the plugin the
//! lists around such ops, and runs them on its own CPU backend in between. Its own process, since the plugin
//! reads `KAZEIA_VULKAN_DISABLE` when it creates a backend.

#[path = "it/common/mod.rs"]
#[allow(dead_code)] // this binary uses one of the fixtures
mod common;

use std::sync::Arc;

use kazeia_backend_abi::plugin::OpKind;
use kazeia_backend_abi::Backend;
use kazeia_engine::codec::CodecDecoder;
use kazeia_engine::codes::parse_codes_json;
use kazeia_engine::lm::{LmBackends, TtsModel};
use kazeia_engine::plugins::{inspect, PluginBackend};
use kazeia_engine::{CpuBackend, WeightFormat, WeightStorage};

#[test]
fn ops_the_plugin_does_not_take_run_on_the_cpu_between_its_lists() {
    std::env::set_var("KAZEIA_VULKAN_DISABLE", "strided,rope");
    let info = inspect(&kazeia_tests::vulkan_plugin());
    assert!(info.is_available(), "{:?}", info.unavailable);
    let vulkan = PluginBackend::create(&info, 0, 1).unwrap();
    for kind in [OpKind::Copy, OpKind::Add, OpKind::Mul, OpKind::Rope] {
        assert!(!vulkan.supports_kind(kind), "{kind:?}");
    }
    for kind in [OpKind::Linear, OpKind::Conv1d, OpKind::Attention] {
        assert!(vulkan.supports_kind(kind), "{kind:?}");
    }

    let dir = common::fixtures().join("codec/window");
    let codes =
        parse_codes_json(&std::fs::read_to_string(dir.join("codes.json")).unwrap()).unwrap();
    let split = CodecDecoder::load(&dir, Arc::new(vulkan))
        .unwrap()
        .decode(&codes)
        .unwrap();
    let cpu = CodecDecoder::load(&dir, Arc::new(CpuBackend::new(1)))
        .unwrap()
        .decode(&codes)
        .unwrap();
    let err = split
        .iter()
        .zip(&cpu)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    eprintln!(
        "decoder with strided ops and rope on the CPU between Vulkan lists: {err:e} from the CPU"
    );
    assert_eq!(split.len(), cpu.len());
    assert!(err <= 1e-3, "{err:e}");

    // The LM stages too: their KV appends now run here, so the engine must not call the caches resident on the
    // device (the plugin would not see them change). The official greedy codes tell.
    let lm = common::fixtures().join("lm/shape_0b6");
    let plugin: Arc<dyn Backend> = Arc::new(PluginBackend::create(&info, 0, 1).unwrap());
    let model = TtsModel::load_on(
        &lm,
        LmBackends {
            talker: plugin.clone(),
            code_predictor: plugin,
        },
        WeightStorage::Convert(WeightFormat::F32),
    )
    .unwrap();
    let run = &common::runs("shape_0b6")[0];
    let codes = common::greedy_codes(&model, run);
    let expected: Vec<Vec<u32>> = run["codes"]
        .as_array()
        .unwrap()
        .iter()
        .map(common::ids)
        .collect();
    assert_eq!(codes, expected);
}
