//! The startup self-test: every kernel once on small shapes that reach its edge cases (partial tiles and
//! blocks, several key blocks, grouped heads, windows), compared with the CPU backend (linear layers: with an f64
//! product of the very weights the device holds). A kernel that fails — wrong numbers, a driver error — is
//! disabled and its ops run on the CPU.

use kazeia_backend_abi::{AttentionSpan, Backend, Heads, Strided, View, WeightFormat};

use crate::backend::{all_kernels, VulkanBackend};
use kazeia_backend_abi::list::{TensorRecord, NO_TENSOR};

use crate::ops::{Math, Op};
use crate::pipelines::{Activation, Format, GemmMode, Kernel, NormKind};
use crate::weights::{f16_bits, f16_to_f32, GpuWeight};

/// Max abs error allowed, relative to the reference's peak (at least 1): f32 rounding of short sums.
const TOLERANCE: f32 = 1e-4;

/// Each kernel with its result: `Err` says why it cannot be used.
pub fn run(backend: &VulkanBackend) -> Vec<(Kernel, Result<(), String>)> {
    all_kernels()
        .into_iter()
        .filter(|&k| backend.is_enabled(k))
        .map(|k| (k, test_kernel(backend, k)))
        .collect()
}

/// Deterministic values in [-scale, scale).
pub fn values(n: usize, seed: u32, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            ((state >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Max abs difference, or why it is too large.
pub fn compare(what: &str, got: &[f32], want: &[f32], tolerance: f32) -> Result<f32, String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} values instead of {}",
            got.len(),
            want.len()
        ));
    }
    let peak = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1.0);
    let err = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, |m, e| {
            if e.is_nan() || m.is_nan() {
                f32::NAN
            } else {
                m.max(e)
            }
        });
    if err.is_nan() || err > tolerance * peak {
        return Err(format!("{what}: max error {err:e} (peak {peak})"));
    }
    Ok(err)
}

/// One op of a self-test on host slices: inputs `a`, `b`, `c` (empty: absent) and the output, updated in place.
struct HostOp<'a> {
    math: Math,
    weight: Option<&'a GpuWeight>,
    inputs: [&'a [f32]; 3],
    out: *mut f32,
    out_len: usize,
}

fn op<'a>(
    math: Math,
    weight: Option<&'a GpuWeight>,
    a: &'a [f32],
    b: &'a [f32],
    c: &'a [f32],
    out: &mut [f32],
) -> HostOp<'a> {
    HostOp {
        math,
        weight,
        inputs: [a, b, c],
        out: out.as_mut_ptr(),
        out_len: out.len(),
    }
}

/// Runs `ops` on the device as one list, each slice a host tensor of its own.
fn on_device(backend: &VulkanBackend, ops: &[HostOp<'_>]) -> Result<(), String> {
    let mut tensors = Vec::new();
    let mut device_ops = Vec::new();
    for host in ops {
        let mut operands = [NO_TENSOR; 4];
        let mut lens = [0; 4];
        for (i, x) in host.inputs.iter().enumerate() {
            if !x.is_empty() {
                tensors.push(TensorRecord::host(
                    x.as_ptr() as *mut f32,
                    x.len(),
                    TensorRecord::HOST_IN,
                ));
                operands[i] = (tensors.len() - 1) as u32;
                lens[i] = x.len();
            }
        }
        tensors.push(TensorRecord::host(
            host.out,
            host.out_len,
            TensorRecord::HOST_IN | TensorRecord::HOST_OUT,
        ));
        operands[3] = (tensors.len() - 1) as u32;
        lens[3] = host.out_len;
        let op = Op {
            math: host.math,
            weight: host.weight,
            operands,
            lens,
        };
        op.validate()?;
        device_ops.push(op);
    }
    backend.run_ops(&tensors, &device_ops)
}

/// The values a linear weight holds, `[out][padded]`, decoded from `LinearWeight::export` bytes.
pub fn dequantize(bytes: &[u8], out: usize, padded: usize, format: WeightFormat) -> Vec<f32> {
    let body = &bytes[33..];
    let n = out * padded;
    let f32_at = |b: &[u8], i: usize| {
        f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
    };
    let u16_at = |b: &[u8], i: usize| u16::from_le_bytes([b[2 * i], b[2 * i + 1]]);
    match format {
        WeightFormat::F32 => (0..n).map(|i| f32_at(body, i)).collect(),
        WeightFormat::F16 => (0..n).map(|i| f16_to_f32(u16_at(body, i))).collect(),
        WeightFormat::BF16 => (0..n)
            .map(|i| f32::from_bits((u16_at(body, i) as u32) << 16))
            .collect(),
        WeightFormat::Q8_0 => {
            let quants = &body[n / 32 * 4..];
            (0..n)
                .map(|i| quants[i] as i8 as f32 * f32_at(body, i / 32))
                .collect()
        }
        WeightFormat::Q4_0 => {
            let nibbles = &body[n / 32 * 4..];
            (0..n)
                .map(|i| {
                    let (block, e) = (i / 32, i % 32);
                    let byte = nibbles[block * 16 + e % 16];
                    let q = if e < 16 { byte & 15 } else { byte >> 4 };
                    (q as i32 - 8) as f32 * f32_at(body, block)
                })
                .collect()
        }
    }
}

/// Rounds to F16 and back (what an F16 weight holds).
pub fn round_f16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| f16_to_f32(f16_bits(x))).collect()
}

fn format_of(f: Format) -> WeightFormat {
    WeightFormat::from_code(f as u32).expect("a format code")
}

fn test_kernel(backend: &VulkanBackend, kernel: Kernel) -> Result<(), String> {
    let gpu = &backend.gpu;
    let cpu = backend.cpu();
    let device = |ops: &[HostOp<'_>]| on_device(backend, ops);
    match kernel {
        Kernel::Matvec(f) | Kernel::Gemm(GemmMode::Linear, f) => {
            let (out, inp, rows) = if matches!(kernel, Kernel::Matvec(_)) {
                (37, 80, 3)
            } else {
                (70, 45, 19)
            };
            let w = values(out * inp, 1, 0.5);
            let bias = values(out, 2, 0.5);
            let x = values(rows * inp, 3, 1.0);
            let weight = GpuWeight::linear(gpu, &w, out, inp, Some(&bias), format_of(f))?;
            let padded = inp.div_ceil(32) * 32;
            let held = dequantize(&weight.export_linear()?, out, padded, format_of(f));
            let weight = weight;
            let mut y = vec![0.0; rows * out];
            device(&[op(
                Math::Linear { rows },
                Some(&weight),
                &x,
                &[],
                &[],
                &mut y,
            )])?;
            let want: Vec<f32> = (0..rows * out)
                .map(|i| {
                    let (r, o) = (i / out, i % out);
                    let dot: f64 = (0..inp)
                        .map(|j| held[o * padded + j] as f64 * x[r * inp + j] as f64)
                        .sum();
                    (dot + bias[o] as f64) as f32
                })
                .collect();
            compare("linear", &y, &want, TOLERANCE).map(drop)
        }
        Kernel::Gemm(GemmMode::Conv, f) => {
            let (cout, cin, k, dilation, len) = (9, 5, 7, 3, 60);
            let mut w = values(cout * cin * k, 4, 0.5);
            if f == Format::F16 {
                w = round_f16(&w);
            }
            let bias = values(cout, 5, 0.5);
            let x = values(cin * len, 6, 1.0);
            let weight = GpuWeight::conv1d(gpu, &w, (cout, cin, k), &bias, f)?;
            let lout = len - (k - 1) * dilation;
            let mut y = vec![0.0; cout * lout];
            device(&[op(
                Math::Conv1d { len, dilation },
                Some(&weight),
                &x,
                &[],
                &[],
                &mut y,
            )])?;
            let mut want = vec![0.0; cout * lout];
            cpu.conv1d(
                &cpu.upload_conv1d(&w, cout, cin, k, Some(&bias)),
                &x,
                len,
                dilation,
                &mut want,
            );
            compare("conv1d", &y, &want, TOLERANCE).map(drop)
        }
        Kernel::Gemm(GemmMode::ConvTranspose, f) => {
            let (cin, cout, k, stride, len) = (6, 5, 10, 4, 7);
            let mut w = values(cin * cout * k, 7, 0.5);
            if f == Format::F16 {
                w = round_f16(&w);
            }
            let x = values(cin * len, 8, 1.0);
            let weight = GpuWeight::conv_transpose1d(gpu, &w, (cin, cout, k), stride, f)?;
            let full = (len - 1) * stride + k;
            let mut y = vec![f32::NAN; cout * full];
            device(&[op(
                Math::ConvTranspose { len },
                Some(&weight),
                &x,
                &[],
                &[],
                &mut y,
            )])?;
            let mut want = vec![0.0; cout * full];
            cpu.conv_transpose1d(
                &cpu.upload_conv_transpose1d(&w, cin, cout, k, stride),
                &x,
                len,
                &mut want,
            );
            compare("conv_transpose1d", &y, &want, TOLERANCE).map(drop)
        }
        Kernel::Depthwise => {
            let (channels, k, len) = (6, 7, 30);
            let w = values(channels * k, 9, 0.5);
            let bias = values(channels, 10, 0.5);
            let x = values(channels * len, 11, 1.0);
            let weight = GpuWeight::depthwise(gpu, &w, channels, k, &bias)?;
            let mut y = vec![0.0; channels * (len + 1 - k)];
            device(&[op(
                Math::Depthwise { len },
                Some(&weight),
                &x,
                &[],
                &[],
                &mut y,
            )])?;
            let mut want = vec![0.0; y.len()];
            cpu.depthwise_conv1d(
                &cpu.upload_depthwise_conv1d(&w, channels, k, Some(&bias)),
                &x,
                len,
                &mut want,
            );
            compare("depthwise_conv1d", &y, &want, TOLERANCE).map(drop)
        }
        Kernel::Eltwise(act) => {
            let (channels, len) = (4, 250);
            let x = values(channels * len, 12, 6.0);
            let mut y = x.clone();
            let mut want = x.clone();
            match act {
                Activation::Gelu => {
                    device(&[op(Math::Gelu, None, &[], &[], &[], &mut y)])?;
                    cpu.gelu(&mut want);
                }
                Activation::Silu => {
                    device(&[op(Math::Silu, None, &[], &[], &[], &mut y)])?;
                    cpu.silu(&mut want);
                }
                Activation::SiluMul => {
                    let up = values(x.len(), 13, 2.0);
                    device(&[op(Math::SiluMul, None, &up, &[], &[], &mut y)])?;
                    cpu.silu_mul(&mut want, &up);
                }
                Activation::SnakeBeta => {
                    let alpha: Vec<f32> =
                        values(channels, 14, 1.0).iter().map(|v| v.exp()).collect();
                    let inv_beta: Vec<f32> = values(channels, 15, 1.0)
                        .iter()
                        .map(|v| 1.0 / (v.exp() + 1e-9))
                        .collect();
                    device(&[op(
                        Math::SnakeBeta { len },
                        None,
                        &alpha,
                        &inv_beta,
                        &[],
                        &mut y,
                    )])?;
                    cpu.snake_beta(&mut want, len, &alpha, &inv_beta);
                }
            }
            compare(&format!("{act:?}"), &y, &want, TOLERANCE).map(drop)
        }
        Kernel::Norm(kind) => {
            let (rows, dim) = (3, 100);
            let x = values(rows * dim, 16, 3.0);
            let g = values(dim, 17, 1.0);
            let b = values(dim, 18, 1.0);
            let mut y = x.clone();
            let mut want = x.clone();
            if kind == NormKind::Rms {
                device(&[op(
                    Math::RmsNorm { dim, eps: 1e-6 },
                    None,
                    &g,
                    &[],
                    &[],
                    &mut y,
                )])?;
                cpu.rms_norm(&mut want, dim, &g, 1e-6);
            } else {
                device(&[op(
                    Math::LayerNorm { dim, eps: 1e-5 },
                    None,
                    &g,
                    &b,
                    &[],
                    &mut y,
                )])?;
                cpu.layer_norm(&mut want, dim, &g, &b, 1e-5);
            }
            compare(&format!("{kind:?} norm"), &y, &want, TOLERANCE).map(drop)
        }
        Kernel::Rope => {
            let (rows, heads, head_dim, start_pos, theta) = (3, 2, 16, 1000, 10000.0);
            let x = values(rows * heads * head_dim, 19, 1.0);
            let mut y = x.clone();
            let mut want = x.clone();
            device(&[op(
                Math::Rope {
                    heads,
                    head_dim,
                    start_pos,
                    theta,
                },
                None,
                &[],
                &[],
                &[],
                &mut y,
            )])?;
            cpu.rope(&mut want, heads, head_dim, start_pos, theta);
            compare("rope", &y, &want, TOLERANCE).map(drop)
        }
        Kernel::Attention => {
            let heads = Heads {
                q_heads: 4,
                kv_heads: 2,
                head_dim: 72,
            };
            let d = heads.head_dim;
            let (queries, keys) = (5, 80);
            let q = values(queries * heads.q_heads * d, 20, 1.0);
            let k = values(keys * heads.kv_heads * d, 21, 1.0);
            let v = values(keys * heads.kv_heads * d, 22, 1.0);
            let spans = [
                AttentionSpan {
                    queries,
                    query_start: 75,
                    keys,
                    key_start: 0,
                    window: None,
                },
                AttentionSpan {
                    queries,
                    query_start: 78,
                    keys,
                    key_start: 3,
                    window: Some(70),
                },
                // The first query sees no key: its output is zero.
                AttentionSpan {
                    queries,
                    query_start: 9,
                    keys,
                    key_start: 10,
                    window: None,
                },
            ];
            let scale = 1.0 / (d as f32).sqrt();
            let mut outs: Vec<Vec<f32>> = spans.iter().map(|_| vec![f32::NAN; q.len()]).collect();
            let ops: Vec<HostOp<'_>> = spans
                .iter()
                .zip(outs.iter_mut())
                .map(|(span, out)| {
                    op(
                        Math::Attention {
                            heads,
                            span: *span,
                            scale,
                        },
                        None,
                        &q,
                        &k,
                        &v,
                        out,
                    )
                })
                .collect();
            device(&ops)?;
            for (span, out) in spans.iter().zip(&outs) {
                let mut want = vec![0.0; q.len()];
                cpu.attention(&q, &k, &v, heads, *span, scale, &mut want);
                compare(&format!("attention {span:?}"), out, &want, TOLERANCE)?;
            }
            Ok(())
        }
        Kernel::Strided(combine) => {
            // A transpose into the middle of a wider buffer, and a per-row value broadcast over a partial view
            // (zero source stride, destination offset): copies, sums and products are exact.
            let (rows, cols) = (37, 70);
            let x = values(rows * cols, 23, 4.0);
            let shapes = [
                Strided {
                    rows,
                    cols,
                    src: View::rows(0, cols),
                    dst: View {
                        offset: 5,
                        row_stride: 1,
                        col_stride: rows + 3,
                    },
                },
                Strided {
                    rows: rows - 1,
                    cols: cols / 2,
                    src: View {
                        offset: 7,
                        row_stride: 1,
                        col_stride: 0,
                    },
                    dst: View::rows(cols / 2, cols),
                },
            ];
            for (i, shape) in shapes.iter().enumerate() {
                let dst_len = rows * cols + 5 + 3 * cols;
                let start = values(dst_len, 24 + i as u32, 2.0);
                let mut y = start.clone();
                let mut want = start;
                let math = Math::Strided {
                    combine,
                    shape: *shape,
                };
                device(&[op(math, None, &x, &[], &[], &mut y)])?;
                cpu.strided(combine, &x, &mut want, *shape);
                compare(&format!("{combine:?} {shape:?}"), &y, &want, 0.0)?;
            }
            Ok(())
        }
    }
}
