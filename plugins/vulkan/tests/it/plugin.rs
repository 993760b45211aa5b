//! The plugin as the engine uses it: `libkazeia_backend_vulkan.so` loaded with `dlopen`, describing its device,
//! reporting itself unavailable with the reason when there is no Vulkan driver or loader (the engine then falls
//! back to the CPU), and taking whole op lists through `run_list`.

use std::ffi::c_void;
use std::path::PathBuf;

use kazeia_backend_abi::list::{HostList, List, OpRecord, TensorRecord};
use kazeia_backend_abi::plugin::{ErrorBuffer, OpKind, PluginApi, WeightDesc, WeightKind};
use kazeia_backend_abi::Weight;

use crate::common::codec::max_abs_diff;
use crate::common::three_queries_over_eight_keys;
use kazeia_backend_abi::{Backend, WeightFormat};
use kazeia_backend_cpu::CpuBackend;
use kazeia_engine::plugins::{backend_named, discover, discover_for, inspect, PluginBackend};

fn plugin() -> PathBuf {
    kazeia_tests::vulkan_plugin()
}

#[test]
fn the_plugin_loads_and_describes_its_device() {
    let info = inspect(&plugin());
    assert!(info.is_available(), "{:?}", info.unavailable);
    assert_eq!(info.name, "vulkan");
    assert!(!info.devices.is_empty());
    eprintln!("score {}, devices: {:?}", info.score, info.devices);
    if info.devices[0].contains("CPU (software Vulkan") {
        // lavapipe: usable when asked for, never preferred to the CPU plugin (whose builds score ≥ 10).
        assert_eq!(info.score, 1);
    } else {
        assert!(info.score >= 40, "a GPU scores above the CPU plugin");
    }
}

/// Runs the ignored test `name` of this module in a child process with `env` (the probe runs once per
/// process), returning its output.
fn child(name: &str, env: &[(&str, &str)]) -> String {
    kazeia_tests::run_ignored_test_in_child(module_path!(), name, env)
}

#[test]
fn without_a_driver_or_a_loader_the_plugin_is_unavailable_and_stages_fall_back_to_cpu() {
    let none = "/nonexistent/kazeia-test-icd.json";
    let text = child(
        "report_unavailable",
        &[("VK_ICD_FILENAMES", none), ("VK_DRIVER_FILES", none)],
    );
    assert!(text.contains("no usable Vulkan device"), "{text}");
    let text = child(
        "report_unavailable",
        &[("KAZEIA_VULKAN_LOADER", "/nonexistent/libvulkan.so.1")],
    );
    assert!(text.contains("no Vulkan loader"), "{text}");
}

#[test]
fn a_process_that_asks_for_no_vulkan_stage_does_not_start_vulkan() {
    let text = child("probe_only_what_is_asked", &[]);
    assert!(text.contains("probed vulkan"), "{text}");
}

/// Whether the Vulkan loader is mapped into this process.
fn vulkan_loaded() -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .contains("libvulkan.so")
}

/// The child side of the test above (a fresh process: no Vulkan loaded by another test).
#[test]
#[ignore]
fn probe_only_what_is_asked() {
    let dirs = [plugin().parent().unwrap().to_owned()];
    assert!(!vulkan_loaded());
    let found = discover_for(&dirs, &["cpu", "cpu:0"]);
    // Listed by its file, not even loaded (its initialisers never ran): no stage asks for it.
    let info = found
        .iter()
        .find(|p| p.path.file_name() == plugin().file_name())
        .expect("listed");
    assert!(!info.is_available());
    assert!(
        info.unavailable.as_deref().unwrap().contains("not loaded"),
        "{:?}",
        info.unavailable
    );
    assert!(!vulkan_loaded(), "listing the plugin started its driver");
    let (backend, _) = backend_named("cpu", 1, &found);
    assert_eq!(backend.name(), "cpu");
    assert!(!vulkan_loaded(), "a CPU stage started the Vulkan driver");

    let found = discover_for(&dirs, &["cpu", "vulkan:0"]);
    let info = found.iter().find(|p| p.name == "vulkan").expect("listed");
    assert!(info.is_available(), "{:?}", info.unavailable);
    assert!(vulkan_loaded());
    eprintln!("probed vulkan: {:?}", info.devices);
}

/// The child side of the test above (run only by it, in an environment without Vulkan).
#[test]
#[ignore]
fn report_unavailable() {
    let dir = plugin().parent().unwrap().to_owned();
    let found = discover(&[dir]);
    let info = found
        .iter()
        .find(|p| p.name == "vulkan")
        .expect("the plugin is found");
    let reason = info.unavailable.clone().expect("unavailable");
    assert_eq!(info.score, 0);
    assert!(info.devices.is_empty());
    let (backend, warning) = backend_named("vulkan", 1, &found);
    assert_eq!(backend.name(), "cpu");
    let warning = warning.expect("a warning");
    assert!(warning.contains(&reason), "{warning}");
    eprintln!("reason: {reason}\nwarning: {warning}");
}

/// The plugin's table, in-process (the same functions `dlopen` reaches).
fn api() -> &'static PluginApi {
    kazeia_backend_vulkan::plugin::table()
}

struct Plugin {
    api: &'static PluginApi,
    backend: *mut c_void,
}

impl Plugin {
    fn new() -> Plugin {
        let api = api();
        let mut err = ErrorBuffer::default();
        // SAFETY: the ABI's create.
        let backend = unsafe { (api.create)(0, 1, &mut err) };
        assert!(!backend.is_null(), "{}", err.text());
        Plugin { api, backend }
    }

    fn upload(
        &self,
        kind: WeightKind,
        dims: [u64; 4],
        w: &[f32],
        bias: Option<&[f32]>,
    ) -> Result<*mut c_void, String> {
        let desc = WeightDesc {
            kind: kind as u32,
            format: WeightFormat::F32.code(),
            dims,
            data: w.as_ptr(),
            data_len: w.len(),
            bias: bias.map_or(std::ptr::null(), <[f32]>::as_ptr),
            bias_len: bias.map_or(0, <[f32]>::len),
        };
        let mut err = ErrorBuffer::default();
        // SAFETY: live slices for the call.
        let weight = unsafe { (self.api.upload)(self.backend, &desc, &mut err) };
        if weight.is_null() {
            Err(err.text())
        } else {
            Ok(weight)
        }
    }

    fn run(&self, list: List<'_>) -> Result<(), String> {
        let mut err = ErrorBuffer::default();
        let raw = list.raw();
        // SAFETY: a list over live buffers.
        let status = unsafe { (self.api.run_list)(self.backend, &raw, &mut err) };
        if status == 0 {
            Ok(())
        } else {
            Err(err.text())
        }
    }

    fn stats(&self) -> kazeia_backend_vulkan::Stats {
        // SAFETY: the backend pointer is a `VulkanBackend` made by this plugin.
        unsafe { (*(self.backend as *const kazeia_backend_vulkan::VulkanBackend)).stats() }
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        // SAFETY: created by this table.
        unsafe { (self.api.destroy)(self.backend) }
    }
}

/// A weight handle of this plugin as the `Weight` it is (the plugin boxes `Weight`s).
fn weight<'a>(handle: *mut c_void) -> &'a Weight {
    // SAFETY: a live handle of this plugin's `upload`, a boxed `Weight`.
    unsafe { &*(handle as *const Weight) }
}

/// `n` of a record from its first two values.
fn n2(n: [usize; 2]) -> [u64; 8] {
    kazeia_backend_abi::list::sizes(&n)
}

/// Appends a SnakeBeta with `(alpha, inv_beta)` over `len` columns of `t`, in place.
fn snake_beta(l: &mut HostList, (alpha, inv_beta): (u32, u32), t: u32, len: usize) {
    let params = [Some(alpha), Some(inv_beta), None];
    l.op(OpKind::SnakeBeta, None, params, t, n2([len, 0]), 0.0);
}

/// Appends a convolution by `w`, dilated by `dilation`, of the `len` columns of `x` into `y`.
fn conv1d<'a>(l: &mut HostList<'a>, w: &'a Weight, x: u32, y: u32, len: usize, dilation: usize) {
    l.op(
        OpKind::Conv1d,
        Some(w),
        [Some(x), None, None],
        y,
        n2([len, dilation]),
        0.0,
    );
}

/// Appends a strided copy of `count` consecutive values of a tensor, from `(tensor, offset)` to `(tensor, offset)`.
fn copy_values(l: &mut HostList, (from, src): (u32, usize), (to, dst): (u32, usize), count: usize) {
    let part = kazeia_backend_abi::Strided {
        rows: 1,
        cols: count,
        src: kazeia_backend_abi::View::rows(src, count),
        dst: kazeia_backend_abi::View::rows(dst, count),
    };
    let n = kazeia_backend_abi::plugin::strided_n(part);
    l.op(OpKind::Copy, None, [Some(from), None, None], to, n, 0.0);
}

#[test]
fn a_residual_unit_as_one_op_list_is_one_submission_and_replays() {
    // SnakeBeta → dilated conv → SnakeBeta → k1 conv, the BigVGAN residual unit, as one `run_ops` list: the
    // intermediates stay on the device, one submission runs it, and the second run replays the recording.
    let p = Plugin::new();
    let cpu = CpuBackend::new(1);
    let (c, len, dilation) = (16, 200, 3);
    let w1 = kazeia_tests::values(c * c * 7, 1);
    let w2 = kazeia_tests::values(c * c, 2);
    let b1 = kazeia_tests::values(c, 3);
    let b2 = kazeia_tests::values(c, 4);
    let alpha: Vec<f32> = kazeia_tests::values(c, 5).iter().map(|v| v.exp()).collect();
    let inv_beta: Vec<f32> = kazeia_tests::values(c, 6)
        .iter()
        .map(|v| 1.0 / (v.exp() + 1e-9))
        .collect();
    // Both convolutions map `c` channels to `c`, with a bias; kernel sizes 7 and 1.
    let upload_conv = |k: u64, w: &[f32], b: &[f32]| {
        p.upload(WeightKind::Conv1d, [c as u64, c as u64, k, 0], w, Some(b))
            .unwrap()
    };
    let conv1 = upload_conv(7, &w1, &b1);
    let conv2 = upload_conv(1, &w2, &b2);
    let x = kazeia_tests::values(c * len, 7);
    let lout = len - 6 * dilation;

    let run = |p: &Plugin| -> Vec<f32> {
        let mut h = x.clone();
        let mut y = vec![0.0; c * lout];
        let mut l = HostList::new();
        let (a, b, th, ty) = (
            l.input(&alpha),
            l.input(&inv_beta),
            l.in_out(&mut h),
            l.output(&mut y),
        );
        // The conv's output is an intermediate result: no host memory, nothing copied back.
        let mid = l.scratch(c * lout, false);
        snake_beta(&mut l, (a, b), th, len);
        conv1d(&mut l, weight(conv1), th, mid, len, dilation);
        snake_beta(&mut l, (a, b), mid, lout);
        conv1d(&mut l, weight(conv2), mid, ty, lout, 1);
        p.run(l.list()).unwrap();
        drop(l);
        // The host sees the results it holds memory for: the snake's in place, the last conv's.
        assert!(
            h.iter().zip(&x).any(|(a, b)| a != b),
            "snake result copied back"
        );
        y
    };
    let before = p.stats();
    let first = run(&p);
    let mid = p.stats();
    let second = run(&p);
    let after = p.stats();
    assert_eq!(
        (mid.submits - before.submits, mid.recorded - before.recorded),
        (1, 1)
    );
    assert_eq!(
        (
            after.submits - mid.submits,
            after.replayed - mid.replayed,
            after.recorded
        ),
        (1, 1, mid.recorded)
    );
    assert_eq!(after.dispatches - mid.dispatches, 4);
    assert_eq!(
        after.downloaded - mid.downloaded,
        ((c * len + c * lout) * 4) as u64,
        "only the host's tensors come back"
    );
    assert_eq!(first, second);

    let mut h = x.clone();
    cpu.snake_beta(&mut h, len, &alpha, &inv_beta);
    // Both convolutions give `lout` columns: the first by dilation, the second with k = 1.
    let conv_on_cpu = |w: &[f32], b: &[f32], k: usize, x: &[f32], len: usize, dilation: usize| {
        let mut y = vec![0.0; c * lout];
        let weight = cpu.upload_conv1d(w, c, c, k, Some(b));
        cpu.conv1d(&weight, x, len, dilation, &mut y);
        y
    };
    let mut m = conv_on_cpu(&w1, &b1, 7, &h, len, dilation);
    cpu.snake_beta(&mut m, lout, &alpha, &inv_beta);
    let want = conv_on_cpu(&w2, &b2, 1, &m, lout, 1);
    let err = max_abs_diff(&first, &want);
    assert!(err < 1e-4, "{err:e}");
    // SAFETY: weights of this backend, freed once.
    unsafe {
        (p.api.free_weight)(p.backend, conv1);
        (p.api.free_weight)(p.backend, conv2);
    }
}

#[test]
fn an_op_reading_part_of_an_earlier_result_is_one_submission() {
    // Op 3 reads the second half of what op 1 wrote, through a strided copy into an intermediate tensor: which op
    // feeds which is in the list, so it is one submission, and op 3 sees op 1's result.
    let p = Plugin::new();
    let x = kazeia_tests::values(64, 9);
    let mut y = x.clone();
    let mut z = vec![1.0f32; 32];
    let mut l = HostList::new();
    let (ty, tz) = (l.in_out(&mut y), l.in_out(&mut z));
    let half = l.scratch(32, false);
    l.op(OpKind::Silu, None, [None; 3], ty, [0; 8], 0.0);
    // The second half of y into the start of `half`.
    copy_values(&mut l, (ty, 32), (half, 0), 32);
    l.op(
        OpKind::SiluMul,
        None,
        [Some(half), None, None],
        tz,
        [0; 8],
        0.0,
    );
    let before = p.stats();
    p.run(l.list()).unwrap();
    assert_eq!(p.stats().submits - before.submits, 1);
    drop(l);
    let silu = |v: f32| v / (1.0 + (-v).exp());
    for i in 0..32 {
        let want = silu(1.0) * silu(x[32 + i]);
        assert!((z[i] - want).abs() < 1e-6, "{i}: {} vs {want}", z[i]);
    }
}

#[test]
fn a_tensor_that_starts_as_zeros_is_set_on_the_device_and_not_uploaded() {
    // A fresh tensor written in part by a strided copy (the engine marks it ZEROED): the rest reads zeros,
    // whatever its host memory held, and nothing of it is uploaded.
    let p = Plugin::new();
    let x = kazeia_tests::values(8, 3);
    let mut y = vec![f32::NAN; 16];
    let mut l = HostList::new();
    let (tx, ty) = (l.input(&x), l.output(&mut y));
    let mut tensors_zeroed = l.list().tensors.to_vec();
    tensors_zeroed[ty as usize].flags |= TensorRecord::ZEROED;
    copy_values(&mut l, (tx, 0), (ty, 4), 8);
    let ops = l.list().ops.to_vec();
    let before = p.stats();
    p.run(List {
        tensors: &tensors_zeroed,
        ops: &ops,
    })
    .unwrap();
    let after = p.stats();
    assert_eq!(
        after.uploaded - before.uploaded,
        8 * 4 + 4,
        "x and the fill value"
    );
    drop(l);
    assert_eq!(&y[..4], &[0.0; 4]);
    assert_eq!(&y[4..12], &x[..]);
    assert_eq!(&y[12..], &[0.0; 4]);
}

#[test]
fn bad_records_and_weights_are_refused_with_a_reason() {
    let p = Plugin::new();
    let w = kazeia_tests::values(4 * 3 * 7, 1);
    assert!(p
        .upload(WeightKind::Conv1d, [4, 3, 7, 0], &w[..10], None)
        .unwrap_err()
        .contains("need another count"));
    assert!(p
        .upload(WeightKind::ConvTranspose1d, [4, 3, 2, 4], &w[..24], None)
        .unwrap_err()
        .contains("stride"));
    assert!(p
        .upload(WeightKind::Conv1d, [4, 3, 7, 0], &w, Some(&[0.0; 3]))
        .unwrap_err()
        .contains("bias"));
    let conv = p
        .upload(WeightKind::Conv1d, [4, 3, 7, 0], &w, None)
        .unwrap();
    let x = kazeia_tests::values(3 * 20, 2);
    let mut y = vec![0.0; 4 * 14];
    let mut short = vec![0.0; 4 * 13];
    let one = |kind, y: &mut [f32], n| {
        let l = HostList::weighted(kind, weight(conv), &x, y, n);
        p.run(l.list())
    };
    assert!(one(OpKind::Conv1d, &mut short, [20, 1])
        .unwrap_err()
        .contains("conv1d"));
    assert!(one(OpKind::Conv1d, &mut y, [5, 1])
        .unwrap_err()
        .contains("only 5 columns"));
    assert!(one(OpKind::Linear, &mut y, [1, 0])
        .unwrap_err()
        .contains("linear weight"));
    let mut l = HostList::new();
    let t = l.in_out(&mut short);
    l.op(OpKind::Gelu, None, [Some(7), None, None], t, [0; 8], 0.0);
    assert!(p.run(l.list()).unwrap_err().contains("no tensor 7"));
    drop(l);
    let mut unknown = OpRecord::new(OpKind::Gelu);
    unknown.kind = 99;
    unknown.out = 0;
    let tensors = [TensorRecord::scratch(4, false)];
    let list = List {
        tensors: &tensors,
        ops: &[unknown],
    };
    assert!(p.run(list).unwrap_err().contains("unknown kind"));
    one(OpKind::Conv1d, &mut y, [20, 1]).unwrap();
    // SAFETY: the ABI's supports: records asking about their kind alone, or malformed.
    unsafe {
        assert!((p.api.supports)(
            p.backend,
            &OpRecord::new(OpKind::Attention),
            &[0; 4]
        ));
        assert!((p.api.supports)(
            p.backend,
            &OpRecord::new(OpKind::SiluMul),
            &[0; 4]
        ));
        assert!(!(p.api.supports)(p.backend, &unknown, &[4; 4]));
        assert!(!(p.api.supports)(p.backend, std::ptr::null(), &[0; 4]));
        (p.api.free_weight)(p.backend, conv);
    }
}

#[test]
fn a_record_the_plugin_refuses_by_shape_runs_on_the_engines_cpu_with_the_same_result() {
    // Attention heads wider than the kernel's 256: the plugin's `supports` refuses the record (it would refuse to
    // run it too), and the engine runs it on its own CPU backend: the CPU's result to the bit. Narrower heads run
    // on the device.
    let info = inspect(&plugin());
    assert!(info.is_available(), "{:?}", info.unavailable);
    let vulkan = PluginBackend::create(&info, 0, 1).unwrap();
    let cpu = CpuBackend::new(1);
    let p = Plugin::new();
    for head_dim in [64, 256, 320] {
        let (heads, span) = three_queries_over_eight_keys(head_dim);
        let q = kazeia_tests::values(3 * 2 * head_dim, 40);
        let k = kazeia_tests::values(8 * head_dim, 41);
        let v = kazeia_tests::values(8 * head_dim, 42);
        let mut got = vec![f32::NAN; q.len()];
        let mut want = vec![0.0; q.len()];
        let l = HostList::attention(&q, &k, &v, heads, span, 0.05, &mut got);
        let (list, op) = (l.list(), l.list().ops[0]);
        let lens = list.lens(&op);
        let fits = head_dim <= 256;
        assert_eq!(vulkan.supports(&op, lens), fits, "head_dim {head_dim}");
        // SAFETY: the ABI's supports and run_list on a list over live buffers.
        unsafe {
            let lens64 = lens.map(|v| v as u64);
            assert_eq!((p.api.supports)(p.backend, &op, &lens64), fits);
            if !fits {
                let mut err = ErrorBuffer::default();
                assert_ne!((p.api.run_list)(p.backend, &list.raw(), &mut err), 0);
                assert!(err.text().contains("does not fit"), "{}", err.text());
            }
            vulkan.run_list(list).unwrap();
        }
        drop(l);
        cpu.attention(&q, &k, &v, heads, span, 0.05, &mut want);
        if fits {
            let err = max_abs_diff(&got, &want);
            assert!(err < 1e-4, "head_dim {head_dim}: {err:e}");
        } else {
            assert_eq!(got, want, "the CPU's own result");
        }
    }
}
