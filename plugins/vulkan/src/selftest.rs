//! The startup self-test: every kernel on the conformance suite's small cases
//! (`kazeia_backend_conformance::cases::at_load`: partial tiles and blocks, several key blocks, grouped heads,
//! windows, a query that sees no key), through this backend's `supports` and `run_list`, compared with the CPU
//! backend with the suite's tolerances. This file only says which of those cases exercise which kernel, and
//! makes each convolution's weight in the format of the kernel under test. A kernel that fails — wrong numbers,
//! a driver error, no case — is disabled and its ops run on the CPU.

use kazeia_backend_abi::plugin::OpKind;
use kazeia_backend_abi::{Weight, WeightData, WeightFormat};
use kazeia_backend_conformance::{cases, tolerance, Case, Run, Shape};

use crate::backend::{all_kernels, VulkanBackend};
use crate::ops::MATVEC_ROWS;
use crate::pipelines::{Activation, Format, GemmMode, Kernel, NormKind};
use crate::weights::GpuWeight;

/// Each kernel with its result: `Err` says why it cannot be used.
pub fn run(backend: &VulkanBackend) -> Vec<(Kernel, Result<(), String>)> {
    let cases = cases::at_load();
    all_kernels()
        .into_iter()
        .filter(|&k| backend.is_enabled(k))
        .map(|k| (k, test_kernel(backend, k, &cases)))
        .collect()
}

fn format_of(f: Format) -> WeightFormat {
    WeightFormat::from_code(f as u32).expect("a format code")
}

/// Whether `case` runs on `kernel` (the kernel `ops.rs` picks for its op, sizes and weight format).
fn exercises(kernel: Kernel, case: &Case) -> bool {
    let format = |f: Format| case.format == Some(format_of(f));
    match (kernel, case.shape) {
        (Kernel::Matvec(f), Shape::Linear { rows, .. }) => rows <= MATVEC_ROWS && format(f),
        (Kernel::Gemm(GemmMode::Linear, f), Shape::Linear { rows, .. }) => {
            rows > MATVEC_ROWS && format(f)
        }
        (Kernel::Gemm(GemmMode::Conv, f), Shape::Conv1d { .. }) => format(f),
        (Kernel::Gemm(GemmMode::ConvTranspose, f), Shape::ConvTranspose1d { .. }) => format(f),
        (Kernel::Depthwise, Shape::DepthwiseConv1d { .. }) => true,
        (Kernel::Eltwise(act), _) => {
            case.kind
                == match act {
                    Activation::Gelu => OpKind::Gelu,
                    Activation::Silu => OpKind::Silu,
                    Activation::SiluMul => OpKind::SiluMul,
                    Activation::SnakeBeta => OpKind::SnakeBeta,
                }
        }
        (Kernel::Norm(NormKind::Rms), _) => case.kind == OpKind::RmsNorm,
        (Kernel::Norm(NormKind::Layer), _) => case.kind == OpKind::LayerNorm,
        (Kernel::Rope, _) => case.kind == OpKind::Rope,
        (Kernel::Attention, _) => case.kind == OpKind::Attention,
        (Kernel::Strided(combine), _) => case.kind == OpKind::from(combine),
        _ => false,
    }
}

fn test_kernel(backend: &VulkanBackend, kernel: Kernel, cases: &[Case]) -> Result<(), String> {
    let gpu = &backend.gpu;
    // A convolution's weight in the kernel's format (the backend's own upload picks one for all of them);
    // the rest as the backend uploads them.
    let upload = |data: WeightData<'_>| -> Result<Weight, String> {
        let w = match (kernel, data) {
            (
                Kernel::Gemm(GemmMode::Conv, f),
                WeightData::Conv1d {
                    w,
                    cout,
                    cin,
                    k,
                    bias,
                    ..
                },
            ) => {
                let bias = bias.map_or_else(|| vec![0.0; cout], <[f32]>::to_vec);
                GpuWeight::conv1d(gpu, w, (cout, cin, k), &bias, f)?
            }
            (
                Kernel::Gemm(GemmMode::ConvTranspose, f),
                WeightData::ConvTranspose1d {
                    w,
                    cin,
                    cout,
                    k,
                    stride,
                    ..
                },
            ) => GpuWeight::conv_transpose1d(gpu, w, (cin, cout, k), stride, f)?,
            _ => return kazeia_backend_abi::Backend::upload(backend, data),
        };
        Ok(Weight::new(w))
    };
    let mine: Vec<&Case> = cases.iter().filter(|c| exercises(kernel, c)).collect();
    if mine.is_empty() {
        return Err(format!("no self-test case runs {kernel:?}"));
    }
    for case in mine {
        let inputs = case.inputs();
        let got = match case.run_on(backend, &inputs, &upload) {
            Run::Ran(got) => got,
            Run::Refused(why) | Run::Failed(why) => return Err(format!("{}: {why}", case.name())),
        };
        tolerance::compare(&got, &case.reference(&inputs), case.tolerance(false))
            .map_err(|e| format!("{}: {e}", case.name()))?;
    }
    Ok(())
}
