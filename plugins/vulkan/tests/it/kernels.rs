//! The kernels on the real driver (lavapipe in CI), in-process: the startup self-test passes with both reduction
//! variants, every op matches the CPU backend on the decoder's and the language models' shapes and on awkward
//! ones, and ops the device cannot take fall back to the CPU.

use std::sync::OnceLock;

use kazeia_backend_abi::list::HostList;
use kazeia_backend_abi::plugin::OpKind;
use kazeia_backend_abi::{AttentionSpan, Backend, Heads, WeightFormat};
use kazeia_backend_cpu::CpuBackend;
use kazeia_backend_vulkan::{Format, GemmMode, Kernel, Options, VulkanBackend};

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

/// Runs a list in-process, as the plugin table would (weights are `*const Weight`s of `b`).
fn run(b: &VulkanBackend, l: HostList<'_>) {
    let list = l.list();
    list.check().unwrap();
    // SAFETY: the list's tensors are the caller's live slices, each op's output disjoint from its inputs.
    unsafe { Backend::run_list(b, list) }
        .unwrap_or_else(|e| panic!("op {}: {e}", list.ops[0].kind));
}

/// `b`'s `supports` of a one-op list's op.
fn supports(b: &VulkanBackend, l: &HostList<'_>) -> bool {
    let list = l.list();
    b.supports(&list.ops[0], list.lens(&list.ops[0]))
}

fn cpu() -> &'static CpuBackend {
    static CPU: OnceLock<CpuBackend> = OnceLock::new();
    CPU.get_or_init(|| CpuBackend::new(1))
}

fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Max abs error, asserted within `tolerance` of the reference's peak (at least 1).
fn assert_close(what: &str, got: &[f32], want: &[f32], tolerance: f32) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let peak = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, |m, e| if e.is_nan() { f32::NAN } else { m.max(e) });
    assert!(
        err <= tolerance * peak,
        "{what}: max error {err:e}, peak {peak}"
    );
    err
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
fn linear_layers_in_every_format_and_row_count_match_the_cpu() {
    // F32 through both kernels; the stored formats decode to exactly the CPU backend's values, so only the
    // summation order differs (Q8_0, Q4_0: the CPU quantises activations to int8 on VNNI and ARM machines, so
    // they are compared with F32 math on their dequantised weights instead, which is what the device computes).
    for (out, inp) in [(64, 64), (37, 80), (130, 1024)] {
        let w = values(out * inp, 1, 0.1);
        let bias = values(out, 2, 0.5);
        for format in [
            WeightFormat::F32,
            WeightFormat::F16,
            WeightFormat::BF16,
            WeightFormat::Q8_0,
            WeightFormat::Q4_0,
        ] {
            let gpu_w = backend(true).upload_linear(&w, out, inp, Some(&bias), format);
            let cpu_w = if matches!(format, WeightFormat::Q8_0 | WeightFormat::Q4_0) {
                let bytes = Backend::export_linear(backend(true), &gpu_w).unwrap();
                let held = dequantized(&bytes, out, inp, format);
                cpu().upload_linear(&held, out, inp, Some(&bias), WeightFormat::F32)
            } else {
                cpu().upload_linear(&w, out, inp, Some(&bias), format)
            };
            for rows in [1, 2, 8, 9, 70] {
                let x = values(rows * inp, 3 + rows as u64, 1.0);
                let mut got = vec![f32::NAN; rows * out];
                let mut want = vec![0.0; rows * out];
                run(
                    backend(true),
                    HostList::weighted(OpKind::Linear, &gpu_w, &x, &mut got, [rows, 0]),
                );
                cpu().linear(&cpu_w, &x, rows, &mut want);
                assert_close(
                    &format!("{format} {out}×{inp}, {rows} rows"),
                    &got,
                    &want,
                    1e-5,
                );
            }
        }
    }
}

/// `[out][inp]` values of a Q8_0 or Q4_0 weight from its export bytes.
fn dequantized(bytes: &[u8], out: usize, inp: usize, format: WeightFormat) -> Vec<f32> {
    let padded = inp.div_ceil(32) * 32;
    let body = &bytes[33..];
    let blocks = out * padded / 32;
    let scale = |b: usize| f32::from_le_bytes(body[4 * b..4 * b + 4].try_into().unwrap());
    let quants = &body[4 * blocks..];
    let mut w = Vec::with_capacity(out * inp);
    for o in 0..out {
        for i in 0..inp {
            let idx = o * padded + i;
            let (b, e) = (idx / 32, idx % 32);
            let q = if format == WeightFormat::Q8_0 {
                quants[idx] as i8 as i32
            } else {
                let byte = quants[b * 16 + e % 16];
                (if e < 16 { byte & 15 } else { byte >> 4 }) as i32 - 8
            };
            w.push(q as f32 * scale(b));
        }
    }
    w
}

#[test]
fn convolutions_of_the_decoder_shapes_match_the_cpu() {
    let b = backend(true);
    // (cout, cin, k, dilation, len): BigVGAN residual convs (k7, dilations 1/3/9, then k1), the output conv
    // to one channel, the pre-conv.
    for (cout, cin, k, dilation, len) in [
        (24, 24, 7, 1, 100),
        (24, 24, 7, 3, 100),
        (24, 24, 7, 9, 160),
        (24, 24, 1, 1, 100),
        (1, 12, 7, 1, 300),
        (70, 33, 3, 1, 20),
    ] {
        let w = values(cout * cin * k, 10, 0.3);
        let bias = values(cout, 11, 0.3);
        let x = values(cin * len, 12, 1.0);
        let lout = len - (k - 1) * dilation;
        let mut got = vec![f32::NAN; cout * lout];
        let mut want = vec![0.0; cout * lout];
        run(
            b,
            HostList::weighted(
                OpKind::Conv1d,
                &b.upload_conv1d(&w, cout, cin, k, Some(&bias)),
                &x,
                &mut got,
                [len, dilation],
            ),
        );
        let cw = cpu().upload_conv1d(&w, cout, cin, k, Some(&bias));
        cpu().conv1d(&cw, &x, len, dilation, &mut want);
        assert_close(
            &format!("conv1d {cin}→{cout} k{k} d{dilation}"),
            &got,
            &want,
            1e-5,
        );
    }
    // Transposed convolutions as the upsamplers use them (k = 2·rate) and odd ones (k not a multiple).
    for (cin, cout, k, stride, len) in [
        (32, 16, 16, 8, 5),
        (16, 8, 10, 5, 9),
        (8, 4, 6, 3, 1),
        (6, 5, 7, 2, 11),
    ] {
        let w = values(cin * cout * k, 13, 0.3);
        let x = values(cin * len, 14, 1.0);
        let full = (len - 1) * stride + k;
        let mut got = vec![f32::NAN; cout * full];
        let mut want = vec![0.0; cout * full];
        run(
            b,
            HostList::weighted(
                OpKind::ConvTranspose1d,
                &b.upload_conv_transpose1d(&w, cin, cout, k, stride),
                &x,
                &mut got,
                [len, 0],
            ),
        );
        let cw = cpu().upload_conv_transpose1d(&w, cin, cout, k, stride);
        cpu().conv_transpose1d(&cw, &x, len, &mut want);
        assert_close(
            &format!("conv_transpose1d k{k} s{stride} len {len}"),
            &got,
            &want,
            1e-5,
        );
    }
    let (channels, k, len) = (40, 7, 50);
    let w = values(channels * k, 15, 0.3);
    let bias = values(channels, 16, 0.3);
    let x = values(channels * len, 17, 1.0);
    let mut got = vec![f32::NAN; channels * (len + 1 - k)];
    let mut want = vec![0.0; got.len()];
    run(
        b,
        HostList::weighted(
            OpKind::DepthwiseConv1d,
            &b.upload_depthwise_conv1d(&w, channels, k, Some(&bias)),
            &x,
            &mut got,
            [len, 0],
        ),
    );
    let cw = cpu().upload_depthwise_conv1d(&w, channels, k, Some(&bias));
    cpu().depthwise_conv1d(&cw, &x, len, &mut want);
    assert_close("depthwise", &got, &want, 1e-5);
}

#[test]
fn norms_activations_rope_and_attention_match_the_cpu_with_either_reduction() {
    for subgroups in [true, false] {
        let b = backend(subgroups);
        let tag = if subgroups {
            "subgroups"
        } else {
            "shared memory"
        };
        let (rows, dim) = (5, 1024);
        let x = values(rows * dim, 20, 4.0);
        let g = values(dim, 21, 1.0);
        let sh = values(dim, 22, 1.0);
        let (mut got, mut want) = (x.clone(), x.clone());
        run(
            b,
            HostList::in_place(OpKind::RmsNorm, &mut got, &g, &[], [dim, 0, 0], 1e-6),
        );
        cpu().rms_norm(&mut want, dim, &g, 1e-6);
        assert_close(&format!("rms_norm ({tag})"), &got, &want, 1e-5);
        let (mut got, mut want) = (x.clone(), x.clone());
        run(
            b,
            HostList::in_place(OpKind::LayerNorm, &mut got, &g, &sh, [dim, 0, 0], 1e-6),
        );
        cpu().layer_norm(&mut want, dim, &g, &sh, 1e-6);
        assert_close(&format!("layer_norm ({tag})"), &got, &want, 1e-5);

        let (mut got, mut want) = (x.clone(), x.clone());
        run(
            b,
            HostList::in_place(OpKind::Gelu, &mut got, &[], &[], [0; 3], 0.0),
        );
        cpu().gelu(&mut want);
        assert_close("gelu", &got, &want, 1e-6);
        let (mut got, mut want) = (x.clone(), x.clone());
        run(
            b,
            HostList::in_place(OpKind::Silu, &mut got, &[], &[], [0; 3], 0.0),
        );
        cpu().silu(&mut want);
        assert_close("silu", &got, &want, 1e-6);
        let up = values(x.len(), 23, 2.0);
        let (mut got, mut want) = (x.clone(), x.clone());
        run(
            b,
            HostList::in_place(OpKind::SiluMul, &mut got, &up, &[], [0; 3], 0.0),
        );
        cpu().silu_mul(&mut want, &up);
        assert_close("silu_mul", &got, &want, 1e-6);
        // SnakeBeta with the large arguments a trained alpha gives.
        let (channels, len) = (8, 640);
        let alpha: Vec<f32> = values(channels, 24, 3.0).iter().map(|v| v.exp()).collect();
        let inv_beta: Vec<f32> = values(channels, 25, 1.0)
            .iter()
            .map(|v| 1.0 / (v.exp() + 1e-9))
            .collect();
        let x = values(channels * len, 26, 30.0);
        let (mut got, mut want) = (x.clone(), x.clone());
        run(
            b,
            HostList::in_place(
                OpKind::SnakeBeta,
                &mut got,
                &alpha,
                &inv_beta,
                [len, 0, 0],
                0.0,
            ),
        );
        cpu().snake_beta(&mut want, len, &alpha, &inv_beta);
        assert_close("snake_beta", &got, &want, 1e-6);

        // RoPE of the talker (16 heads of 128) far into a sequence.
        let (heads, head_dim) = (16, 128);
        let x = values(3 * heads * head_dim, 27, 2.0);
        let (mut got, mut want) = (x.clone(), x.clone());
        run(
            b,
            HostList::in_place(
                OpKind::Rope,
                &mut got,
                &[],
                &[],
                [heads, head_dim, 1500],
                1_000_000.0,
            ),
        );
        cpu().rope(&mut want, heads, head_dim, 1500, 1_000_000.0);
        assert_close("rope", &got, &want, 1e-6);

        // Attention: a talker step over a long cache (GQA 16/8, head 128), a prefill, the decoder's window.
        let cases = [
            (
                Heads {
                    q_heads: 16,
                    kv_heads: 8,
                    head_dim: 128,
                },
                AttentionSpan {
                    queries: 1,
                    query_start: 700,
                    keys: 701,
                    key_start: 0,
                    window: None,
                },
            ),
            (
                Heads {
                    q_heads: 16,
                    kv_heads: 8,
                    head_dim: 128,
                },
                AttentionSpan {
                    queries: 40,
                    query_start: 0,
                    keys: 40,
                    key_start: 0,
                    window: None,
                },
            ),
            (
                Heads {
                    q_heads: 4,
                    kv_heads: 4,
                    head_dim: 64,
                },
                AttentionSpan {
                    queries: 30,
                    query_start: 100,
                    keys: 102,
                    key_start: 28,
                    window: Some(72),
                },
            ),
        ];
        for (heads, span) in cases {
            let d = heads.head_dim;
            let q = values(span.queries * heads.q_heads * d, 28, 1.0);
            let k = values(span.keys * heads.kv_heads * d, 29, 1.0);
            let v = values(span.keys * heads.kv_heads * d, 30, 1.0);
            let scale = 1.0 / (d as f32).sqrt();
            let mut got = vec![f32::NAN; q.len()];
            let mut want = vec![0.0; q.len()];
            run(
                b,
                HostList::attention(&q, &k, &v, heads, span, scale, &mut got),
            );
            cpu().attention(&q, &k, &v, heads, span, scale, &mut want);
            assert_close(&format!("attention {span:?} ({tag})"), &got, &want, 1e-5);
        }
    }
}

#[test]
fn ops_the_device_cannot_take_are_refused_by_shape() {
    // Heads wider than the attention kernel's 256: `supports` says no from the record's sizes, and running it is
    // an error (the engine runs it on its CPU: tests/it/plugin.rs). Nothing is dispatched.
    let b = &backend_with(true);
    let span = AttentionSpan {
        queries: 3,
        query_start: 5,
        keys: 8,
        key_start: 0,
        window: None,
    };
    for head_dim in [256, 320] {
        let heads = Heads {
            q_heads: 2,
            kv_heads: 1,
            head_dim,
        };
        let q = values(3 * 2 * head_dim, 40, 1.0);
        let k = values(8 * head_dim, 41, 1.0);
        let v = values(8 * head_dim, 42, 1.0);
        let mut got = vec![f32::NAN; q.len()];
        let l = HostList::attention(&q, &k, &v, heads, span, 0.05, &mut got);
        assert_eq!(supports(b, &l), head_dim <= 256, "head_dim {head_dim}");
    }
    let heads = Heads {
        q_heads: 2,
        kv_heads: 1,
        head_dim: 320,
    };
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
}

#[test]
fn weighted_ops_past_the_dispatch_limits_are_refused_by_shape() {
    // More output columns than 65535 workgroups of 64 can cover (the minimum limit; lavapipe's): `supports` says
    // no for the convolution and the transposed convolution on device weights (the engine then moves the stage
    // to its CPU: engine-core/tests/fallback.rs), and running one is an error; a smaller one runs.
    // A device whose limit no host buffer reaches (NVIDIA's 2³¹ − 1) takes that length and runs it.
    let b = backend(true);
    let w = values(2 * 3 * 2, 51, 1.0);
    let bias = values(3, 52, 1.0);
    let conv = b.upload_conv1d(&w, 3, 2, 2, Some(&bias));
    let transposed = b.upload_conv_transpose1d(&w, 2, 3, 2, 1);
    let past_the_minimum = 64 * 65_535 + 100;
    let reachable = b.max_workgroups()[0] as usize <= 65_535;
    eprintln!(
        "workgroups at most {:?}: {past_the_minimum} columns {}",
        b.max_workgroups(),
        if reachable { "refused" } else { "fit" }
    );
    for (len, fits) in [(past_the_minimum, !reachable), (1000, true)] {
        let x = values(2 * len, 50, 1.0);
        let mut y = vec![f32::NAN; 3 * (len - 1)];
        let l = HostList::weighted(OpKind::Conv1d, &conv, &x, &mut y, [len, 1]);
        assert_eq!(supports(b, &l), fits, "conv over {len} columns");
        // SAFETY: a list over live buffers.
        let ran = unsafe { Backend::run_list(b, l.list()) };
        assert_eq!(ran.is_ok(), fits, "{ran:?}");
        let mut y = vec![f32::NAN; 3 * (len + 1)];
        let l = HostList::weighted(OpKind::ConvTranspose1d, &transposed, &x, &mut y, [len, 0]);
        assert_eq!(supports(b, &l), fits, "transposed conv over {len} columns");
    }
}
