//! Every kernel on the real driver (lavapipe in CI): the startup self-test passes with both reduction variants,
//! ops match the CPU backend on awkward shapes, and batches keep intermediates on the device and replay.

use kazeia_backend_vulkan::{Options, VulkanBackend};

fn backend(subgroups: bool) -> VulkanBackend {
    let options = Options {
        subgroups: Some(subgroups),
        ..Options::default()
    };
    VulkanBackend::new(0, 1, options).unwrap_or_else(|e| {
        panic!("no Vulkan device for the tests ({e}); install mesa-vulkan-drivers (lavapipe)")
    })
}

#[test]
fn every_kernel_passes_the_self_test_with_either_reduction() {
    for subgroups in [true, false] {
        let t = std::time::Instant::now();
        let b = backend(subgroups);
        eprintln!(
            "{}: subgroups {} → {}, self-test {:?}",
            b.device_name(),
            subgroups,
            b.uses_subgroups(),
            t.elapsed()
        );
        assert!(b.failures.is_empty(), "{:#?}", b.failures);
    }
}
