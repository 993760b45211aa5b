//! Tensors are named by id, never by address: the executor binds a list's tensors by their index in its table
//! and keeps a resident tensor's copy under its resident id, so moving host memory changes neither which plan
//! replays nor which device copy an op reads, and a new id at the same address is a new tensor.

use kazeia_backend_abi::list::HostList;
use kazeia_backend_abi::plugin::{strided_n, OpKind};
use kazeia_backend_abi::{Backend, Strided};
use kazeia_backend_vulkan::{Options, VulkanBackend};

/// A backend of this test's own, so that its counters see only this test's lists.
fn fresh_backend() -> VulkanBackend {
    let options = Options {
        self_test: false,
        ..Options::default()
    };
    VulkanBackend::new(0, 1, options).unwrap_or_else(|e| {
        panic!("no Vulkan device for the tests ({e}); install mesa-vulkan-drivers (lavapipe)")
    })
}

/// Runs `y = cache` on `b`, `cache` resident under `id`; returns what was uploaded and recorded.
fn copy_out(b: &VulkanBackend, cache: &mut [f32], id: u64, y: &mut [f32]) -> (u64, u64) {
    let before = b.stats();
    let n = strided_n(Strided::contiguous(cache.len()));
    let mut l = HostList::new();
    let c = l.in_out(cache);
    l.resident(c, id);
    let out = l.output(y);
    l.op(OpKind::Copy, None, [Some(c), None, None], out, n, 0.0);
    l.list().check().unwrap();
    // SAFETY: a well-formed list over live, distinct buffers, without weights.
    unsafe { Backend::run_list(b, l.list()) }.unwrap();
    let after = b.stats();
    (
        after.uploaded - before.uploaded,
        after.recorded - before.recorded,
    )
}

#[test]
fn a_resident_tensor_is_its_id_wherever_its_host_memory_is() {
    let b = fresh_backend();
    let mut y = vec![0.0f32; 4];

    let mut here = vec![1.0f32, 2.0, 3.0, 4.0];
    assert_eq!(
        copy_out(&b, &mut here, 11, &mut y),
        (16, 1),
        "first seen: uploaded"
    );
    assert_eq!(y, here);

    // The same values under the same id at another address: the device's copy, the same plan.
    let mut moved = here.clone();
    assert_ne!(moved.as_ptr(), here.as_ptr());
    drop(here);
    y.fill(0.0);
    assert_eq!(copy_out(&b, &mut moved, 11, &mut y), (0, 0), "nothing new");
    assert_eq!(y, moved);

    // New values at the same address take a new id: a new tensor, uploaded, not the old copy.
    moved.copy_from_slice(&[5.0, 6.0, 7.0, 8.0]);
    let (uploaded, _) = copy_out(&b, &mut moved, 12, &mut y);
    assert_eq!(uploaded, 16);
    assert_eq!(y, [5.0, 6.0, 7.0, 8.0]);
}

#[test]
fn a_list_replays_whatever_host_memory_its_tensors_use() {
    let b = fresh_backend();
    let run = |x: &[f32], y: &mut [f32]| {
        let mut l = HostList::new();
        let (xi, yi) = (l.input(x), l.output(y));
        let t = l.scratch(x.len(), false);
        let n = strided_n(Strided::contiguous(x.len()));
        l.op(OpKind::Copy, None, [Some(xi), None, None], t, n, 0.0);
        l.op(OpKind::Gelu, None, [None; 3], t, [0; 8], 0.0);
        l.op(OpKind::Copy, None, [Some(t), None, None], yi, n, 0.0);
        // SAFETY: a well-formed list over live, distinct buffers, without weights.
        unsafe { Backend::run_list(&b, l.list()) }.unwrap();
    };
    let (x1, mut y1) = (vec![0.5f32; 64], vec![0.0f32; 64]);
    run(&x1, &mut y1);
    let first = b.stats();
    let (x2, mut y2) = (vec![-1.0f32; 64], vec![0.0f32; 64]);
    run(&x2, &mut y2);
    let second = b.stats();
    assert_eq!((first.recorded, first.replayed), (1, 0));
    assert_eq!(
        (second.recorded, second.replayed),
        (1, 1),
        "other buffers, the same plan"
    );
    assert!((y1[0] - 0.345_731_1).abs() < 1e-6, "{}", y1[0]);
    assert!((y2[0] + 0.158_655_3).abs() < 1e-6, "{}", y2[0]);
}
