//! The plugin as the engine uses it: `libkazeia_backend_vulkan.so` loaded with `dlopen`, describing its device,
//! reporting itself unavailable with the reason when there is no Vulkan driver or loader (the engine then falls
//! back to the CPU), and taking whole op lists through `run_ops`.

use std::ffi::c_void;
use std::path::PathBuf;
use std::process::Command;

use kazeia_backend_abi::plugin::{
    ErrorBuffer, OpKind, OpRecord, PluginApi, WeightDesc, WeightKind,
};
use kazeia_backend_abi::{AttentionSpan, Heads};
use kazeia_backend_abi::{Backend, WeightFormat};
use kazeia_backend_cpu::CpuBackend;
use kazeia_engine::plugins::{backend_named, discover, inspect, PluginBackend};

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

/// Runs the ignored test `name` of this binary in a child process with `env`, returning its stderr.
fn child(name: &str, env: &[(&str, &str)]) -> String {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--ignored", "--nocapture"])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{name} failed:\n{text}");
    text
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

    fn run(&self, ops: &[OpRecord]) -> Result<(), String> {
        let mut err = ErrorBuffer::default();
        // SAFETY: records over live buffers.
        let status = unsafe { (self.api.run_ops)(self.backend, ops.as_ptr(), ops.len(), &mut err) };
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

fn record(
    kind: OpKind,
    weight: *mut c_void,
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    n: [u64; 2],
) -> OpRecord {
    let mut op = OpRecord::new(kind);
    op.weight = weight;
    (op.a, op.a_len) = (a.as_ptr(), a.len());
    (op.b, op.b_len) = (b.as_ptr(), b.len());
    (op.out, op.out_len) = (out.as_mut_ptr(), out.len());
    op.n[0] = n[0];
    op.n[1] = n[1];
    op
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (((i as u32).wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40503)) % 2001) as f32
                / 1000.0
                - 1.0
        })
        .collect()
}

#[test]
fn a_residual_unit_as_one_op_list_is_one_submission_and_replays() {
    // SnakeBeta → dilated conv → SnakeBeta → k1 conv, the BigVGAN residual unit, as one `run_ops` list: the
    // intermediates stay on the device, one submission runs it, and the second run replays the recording.
    let p = Plugin::new();
    let cpu = CpuBackend::new(1);
    let (c, len, dilation) = (16, 200, 3);
    let w1 = values(c * c * 7, 1);
    let w2 = values(c * c, 2);
    let b1 = values(c, 3);
    let b2 = values(c, 4);
    let alpha: Vec<f32> = values(c, 5).iter().map(|v| v.exp()).collect();
    let inv_beta: Vec<f32> = values(c, 6)
        .iter()
        .map(|v| 1.0 / (v.exp() + 1e-9))
        .collect();
    let conv1 = p
        .upload(
            WeightKind::Conv1d,
            [c as u64, c as u64, 7, 0],
            &w1,
            Some(&b1),
        )
        .unwrap();
    let conv2 = p
        .upload(
            WeightKind::Conv1d,
            [c as u64, c as u64, 1, 0],
            &w2,
            Some(&b2),
        )
        .unwrap();
    let x = values(c * len, 7);
    let lout = len - 6 * dilation;

    let run = |p: &Plugin| -> Vec<f32> {
        let mut h = x.clone();
        let mut mid = vec![0.0; c * lout];
        let mut y = vec![0.0; c * lout];
        let ops = [
            record(
                OpKind::SnakeBeta,
                std::ptr::null_mut(),
                &alpha,
                &inv_beta,
                &mut h,
                [len as u64, 0],
            ),
            record(
                OpKind::Conv1d,
                conv1,
                &h,
                &[],
                &mut mid,
                [len as u64, dilation as u64],
            ),
            record(
                OpKind::SnakeBeta,
                std::ptr::null_mut(),
                &alpha,
                &inv_beta,
                &mut mid,
                [lout as u64, 0],
            ),
            record(OpKind::Conv1d, conv2, &mid, &[], &mut y, [lout as u64, 1]),
        ];
        p.run(&ops).unwrap();
        // The host sees every op's result, intermediates included.
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
    assert_eq!(first, second);

    let mut h = x.clone();
    cpu.snake_beta(&mut h, len, &alpha, &inv_beta);
    let mut m = vec![0.0; c * lout];
    cpu.conv1d(
        &cpu.upload_conv1d(&w1, c, c, 7, Some(&b1)),
        &h,
        len,
        dilation,
        &mut m,
    );
    cpu.snake_beta(&mut m, lout, &alpha, &inv_beta);
    let mut want = vec![0.0; c * lout];
    cpu.conv1d(
        &cpu.upload_conv1d(&w2, c, c, 1, Some(&b2)),
        &m,
        lout,
        1,
        &mut want,
    );
    let err = first
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(err < 1e-4, "{err:e}");
    // SAFETY: weights of this backend, freed once.
    unsafe {
        (p.api.free_weight)(p.backend, conv1);
        (p.api.free_weight)(p.backend, conv2);
    }
}

#[test]
fn an_op_reading_part_of_an_earlier_result_splits_the_batch_and_stays_correct() {
    // Op 2 reads the second half of what op 1 wrote: not the same host range, so op 1's result is copied back
    // first (two submissions), and op 2 sees it.
    let p = Plugin::new();
    let x = values(64, 9);
    let mut y = x.clone();
    let mut ops = vec![record(
        OpKind::Silu,
        std::ptr::null_mut(),
        &[],
        &[],
        &mut y,
        [0, 0],
    )];
    let mut z = vec![1.0f32; 32];
    // SAFETY: `y` holds 64 values, so 32..64 is in bounds; the slice overlaps op 1's output on purpose and is only
    // read, through the record, by the plugin after op 1 ran.
    let up = unsafe { std::slice::from_raw_parts(y.as_ptr().add(32), 32) };
    ops.push(record(
        OpKind::SiluMul,
        std::ptr::null_mut(),
        up,
        &[],
        &mut z,
        [0, 0],
    ));
    let before = p.stats();
    p.run(&ops).unwrap();
    assert_eq!(p.stats().submits - before.submits, 2);
    let silu = |v: f32| v / (1.0 + (-v).exp());
    for i in 0..32 {
        let want = silu(1.0) * silu(x[32 + i]);
        assert!((z[i] - want).abs() < 1e-6, "{i}: {} vs {want}", z[i]);
    }
}

#[test]
fn bad_records_and_weights_are_refused_with_a_reason() {
    let p = Plugin::new();
    let w = values(4 * 3 * 7, 1);
    assert!(p
        .upload(WeightKind::Conv1d, [4, 3, 7, 0], &w[..10], None)
        .unwrap_err()
        .contains("dimensions need"));
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
    let x = values(3 * 20, 2);
    let mut y = vec![0.0; 4 * 14];
    let mut short = vec![0.0; 4 * 13];
    assert!(p
        .run(&[record(OpKind::Conv1d, conv, &x, &[], &mut short, [20, 1])])
        .unwrap_err()
        .contains("conv1d"));
    assert!(p
        .run(&[record(OpKind::Conv1d, conv, &x, &[], &mut y, [5, 1])])
        .unwrap_err()
        .contains("only 5 columns"));
    assert!(p
        .run(&[record(OpKind::Linear, conv, &x, &[], &mut y, [1, 0])])
        .unwrap_err()
        .contains("linear weight"));
    let mut unknown = OpRecord::new(OpKind::Gelu);
    unknown.kind = 99;
    assert!(p.run(&[unknown]).unwrap_err().contains("unknown op kind"));
    p.run(&[record(OpKind::Conv1d, conv, &x, &[], &mut y, [20, 1])])
        .unwrap();
    // SAFETY: the ABI's supports: records without buffers.
    unsafe {
        assert!((p.api.supports)(
            p.backend,
            &OpRecord::new(OpKind::Attention)
        ));
        assert!((p.api.supports)(p.backend, &OpRecord::new(OpKind::SiluMul)));
        assert!(!(p.api.supports)(p.backend, &unknown));
        assert!(!(p.api.supports)(p.backend, std::ptr::null()));
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
        let heads = Heads {
            q_heads: 2,
            kv_heads: 1,
            head_dim,
        };
        let span = AttentionSpan {
            queries: 3,
            query_start: 5,
            keys: 8,
            key_start: 0,
            window: None,
        };
        let q = values(3 * 2 * head_dim, 40);
        let k = values(8 * head_dim, 41);
        let v = values(8 * head_dim, 42);
        let mut got = vec![f32::NAN; q.len()];
        let mut want = vec![0.0; q.len()];
        let record = OpRecord::attention(&q, &k, &v, heads, span, 0.05, &mut got);
        let fits = head_dim <= 256;
        assert_eq!(vulkan.supports(&record), fits, "head_dim {head_dim}");
        // SAFETY: the ABI's supports and run_ops on a record over live buffers.
        unsafe {
            assert_eq!((p.api.supports)(p.backend, &record), fits);
            if !fits {
                let mut err = ErrorBuffer::default();
                assert_ne!((p.api.run_ops)(p.backend, &record, 1, &mut err), 0);
                assert!(err.text().contains("does not fit"), "{}", err.text());
            }
            vulkan.run_records(&[record]).unwrap();
        }
        cpu.attention(&q, &k, &v, heads, span, 0.05, &mut want);
        if fits {
            let err = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(err < 1e-4, "head_dim {head_dim}: {err:e}");
        } else {
            assert_eq!(got, want, "the CPU's own result");
        }
    }
}
