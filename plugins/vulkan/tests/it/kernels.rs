//! The kernels on the real driver (lavapipe in CI): the startup self-test passes with both reduction variants,
//! and the conformance suite (`kazeia-backend-conformance`: every op kind at the models' shapes and awkward ones,
//! in every weight format, against the CPU backend) passes with each — in-process on its own, where a case the
//! device refuses fails with an error and dispatches nothing, and as the loaded plugin behind the engine, which
//! runs what it refuses on its CPU with the same result.

use std::sync::OnceLock;

use kazeia_backend_abi::list::HostList;
use kazeia_backend_abi::Backend;

use crate::common::three_queries_over_eight_keys;
use kazeia_backend_conformance::{check, Case, Expect, Shape};
use kazeia_backend_vulkan::{Format, GemmMode, Kernel, Options, VulkanBackend};
use kazeia_engine::plugins::{inspect, PluginBackend};

fn backend_with(subgroups: bool) -> VulkanBackend {
    let options = Options {
        subgroups: Some(subgroups),
        ..Options::default()
    };
    VulkanBackend::new(0, 1, options).unwrap_or_else(|e| {
        panic!("no Vulkan device for the tests ({e}); install mesa-vulkan-drivers (lavapipe)")
    })
}

/// One backend per reduction variant, shared by the tests of this file.
fn backend(subgroups: bool) -> &'static VulkanBackend {
    static WITH: OnceLock<VulkanBackend> = OnceLock::new();
    static WITHOUT: OnceLock<VulkanBackend> = OnceLock::new();
    if subgroups {
        WITH.get_or_init(|| backend_with(true))
    } else {
        WITHOUT.get_or_init(|| backend_with(false))
    }
}

/// What the device refuses of the suite, by shape: attention heads wider than the kernel's 256, and
/// convolutions with more output columns than its workgroups of 64 cover in x (65535 groups on lavapipe and
/// many mobile GPUs, Vulkan's minimum; 2³¹ − 1 on NVIDIA's, which no case reaches).
fn refused_by(b: &VulkanBackend) -> impl Fn(&Case) -> bool {
    let columns = 64 * b.max_workgroups()[0] as usize;
    move |case| match case.shape {
        Shape::Attention { heads, .. } => heads.head_dim > 256,
        Shape::Conv1d {
            k, dilation, len, ..
        } => len - (k - 1) * dilation > columns,
        Shape::ConvTranspose1d { k, stride, len, .. } => {
            ((len - 1) * stride + k).div_ceil(stride) > columns
        }
        _ => false,
    }
}

#[test]
fn every_kernel_passes_the_self_test_with_either_reduction() {
    for subgroups in [true, false] {
        let b = backend(subgroups);
        assert!(b.failures.is_empty(), "{:#?}", b.failures);
        assert_eq!(b.uses_subgroups(), subgroups, "{}", b.device_name());
    }
}

#[test]
fn the_device_passes_the_conformance_suite_with_shared_memory_reductions() {
    let b = backend(false);
    check(b, Expect::everything().refusing(refused_by(b)));
}

#[test]
fn the_loaded_plugin_passes_the_conformance_suite_behind_the_engine() {
    // The plugin's default: subgroup reductions where the device has them (lavapipe does).
    let info = inspect(&kazeia_tests::vulkan_plugin());
    assert!(info.is_available(), "{:?}", info.unavailable);
    let plugin = PluginBackend::create(&info, 0, 1).unwrap();
    check(
        &plugin,
        Expect::everything()
            .refusing(refused_by(backend(true)))
            .through_the_engine(),
    );
}

#[test]
fn an_op_the_device_refuses_is_an_error_and_dispatches_nothing() {
    // Heads wider than the attention kernel's 256: running it anyway is an error before anything is
    // dispatched, and no kernel is disabled for it.
    let b = &backend_with(true);
    let (heads, span) = three_queries_over_eight_keys(320);
    let (q, k, v) = (vec![0.5; 3 * 640], vec![0.5; 8 * 320], vec![0.5; 8 * 320]);
    let mut got = vec![f32::NAN; q.len()];
    let before = b.stats();
    let l = HostList::attention(&q, &k, &v, heads, span, 0.05, &mut got);
    // SAFETY: a list over live buffers.
    let err = unsafe { Backend::run_list(b, l.list()) }.unwrap_err();
    assert!(err.contains("does not fit"), "{err}");
    assert_eq!(
        b.stats().dispatches,
        before.dispatches,
        "nothing was dispatched"
    );
    assert!(b.is_enabled(Kernel::Gemm(GemmMode::Conv, Format::F32)));
    eprintln!(
        "workgroups at most {:?}: convolutions past {} output columns refused",
        b.max_workgroups(),
        64 * b.max_workgroups()[0] as u64
    );
}
