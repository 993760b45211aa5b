//! The Vulkan backend: a device, its pipelines, the kernels that passed the startup self-test, and weights on the
//! device. It takes the ops its kernels run (`supports`, by kind and size) and the weights its device holds; the
//! engine runs the rest on its CPU.

use std::collections::HashSet;
use std::sync::Arc;

use kazeia_backend_abi::list::{List, OpRecord, TensorRecord, NO_TENSOR};
use kazeia_backend_abi::plugin::{OpKind, WeightDesc, WeightKind};
use kazeia_backend_abi::{Backend, Capabilities, Combine, Weight, WeightData, WeightFormat};

use crate::context::Gpu;
use crate::exec::{Executor, Stats};
use crate::ops::{fits, Op};
use crate::pipelines::{Activation, Format, GemmMode, Kernel, NormKind, Pipelines};
use crate::probe::vulkan;
use crate::selftest;
use crate::weights::{GpuWeight, Shape};

/// Choices made when the backend is created (the plugin reads them from the environment).
#[derive(Clone, Debug)]
pub struct Options {
    /// Subgroup arithmetic in reductions: `None` when the device has it, `Some(false)` never (the
    /// shared-memory variants), `Some(true)` when the device has it.
    pub subgroups: Option<bool>,
    /// Store convolution weights as F16 (half the memory and bandwidth; results within F16 rounding).
    pub conv_f16: bool,
    /// Run the startup self-test (kernels failing it are not used: their ops are refused).
    pub self_test: bool,
    /// MiB of resident buffers (KV caches) kept on the device between submissions; 0 uploads them every time.
    pub resident_mb: u64,
    /// Kernel families kept off the device (`matvec`, `gemm`, `depthwise`, `eltwise`, `norm`, `rope`,
    /// `attention`, `strided`): to work around a driver bug, or to compare.
    pub disabled: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            subgroups: None,
            conv_f16: false,
            self_test: true,
            resident_mb: 512,
            disabled: Vec::new(),
        }
    }
}

impl Options {
    /// `KAZEIA_VULKAN_SUBGROUPS=0` forces the shared-memory reductions; `KAZEIA_VULKAN_CONV_F16=1` stores
    /// convolution weights as F16; `KAZEIA_VULKAN_SELF_TEST=0` skips the self-test;
    /// `KAZEIA_VULKAN_DISABLE=strided,attention` keeps kernel families off the device;
    /// `KAZEIA_VULKAN_RESIDENT_MB` (default 512) bounds the KV caches kept on the device.
    pub fn from_env() -> Options {
        let flag = |name: &str| {
            std::env::var(name)
                .ok()
                .map(|v| !matches!(v.trim(), "0" | "false" | "no" | "off" | ""))
        };
        Options {
            subgroups: flag("KAZEIA_VULKAN_SUBGROUPS"),
            conv_f16: flag("KAZEIA_VULKAN_CONV_F16").unwrap_or(false),
            self_test: flag("KAZEIA_VULKAN_SELF_TEST").unwrap_or(true),
            resident_mb: std::env::var("KAZEIA_VULKAN_RESIDENT_MB")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(512),
            disabled: std::env::var("KAZEIA_VULKAN_DISABLE")
                .map(|v| {
                    v.split(',')
                        .map(|f| f.trim().to_ascii_lowercase())
                        .filter(|f| !f.is_empty())
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

/// Every kernel the backend may use.
pub fn all_kernels() -> Vec<Kernel> {
    let mut kernels = Vec::new();
    for f in Format::ALL {
        kernels.push(Kernel::Matvec(f));
        kernels.push(Kernel::Gemm(GemmMode::Linear, f));
    }
    for f in [Format::F32, Format::F16] {
        kernels.push(Kernel::Gemm(GemmMode::Conv, f));
        kernels.push(Kernel::Gemm(GemmMode::ConvTranspose, f));
    }
    kernels.extend([
        Kernel::Depthwise,
        Kernel::Eltwise(Activation::Gelu),
        Kernel::Eltwise(Activation::Silu),
        Kernel::Eltwise(Activation::SiluMul),
        Kernel::Eltwise(Activation::SnakeBeta),
        Kernel::Norm(NormKind::Rms),
        Kernel::Norm(NormKind::Layer),
        Kernel::Rope,
        Kernel::Attention,
        Kernel::Strided(Combine::Copy),
        Kernel::Strided(Combine::Add),
        Kernel::Strided(Combine::Mul),
    ]);
    kernels
}

pub struct VulkanBackend {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) pipelines: Pipelines,
    exec: Arc<Executor>,
    /// Kernels that run on the device (all, until the self-test says otherwise).
    enabled: HashSet<Kernel>,
    /// Self-test failures: kernel and reason.
    pub failures: Vec<(Kernel, String)>,
    options: Options,
}

impl VulkanBackend {
    /// A backend on usable device `device` (0 = best). `threads` is the ABI's thread count, unused: the device
    /// does the work.
    pub fn new(device: usize, _threads: usize, options: Options) -> Result<VulkanBackend, String> {
        let vk = vulkan().map_err(str::to_string)?;
        let info = vk
            .devices
            .get(device)
            .ok_or_else(|| format!("no Vulkan device {device} (there are {})", vk.devices.len()))?;
        let gpu = Gpu::new(vk, info)?;
        let subgroups = gpu.subgroup_arithmetic && options.subgroups != Some(false);
        let pipelines = Pipelines::new(&gpu, subgroups)?;
        let exec = Arc::new(Executor::new(&gpu, options.resident_mb << 20)?);
        let mut backend = VulkanBackend {
            gpu,
            pipelines,
            exec,
            enabled: all_kernels().into_iter().collect(),
            failures: Vec::new(),
            options,
        };
        let disabled: Vec<Kernel> = backend
            .enabled
            .iter()
            .copied()
            .filter(|k| backend.options.disabled.iter().any(|f| *f == k.family()))
            .collect();
        for kernel in disabled {
            backend.enabled.remove(&kernel);
            backend
                .failures
                .push((kernel, "disabled by KAZEIA_VULKAN_DISABLE".into()));
        }
        if backend.options.self_test {
            for (kernel, result) in selftest::run(&backend) {
                if let Err(reason) = result {
                    backend.enabled.remove(&kernel);
                    backend.failures.push((kernel, reason));
                }
            }
        }
        Ok(backend)
    }

    pub fn device_name(&self) -> &str {
        &self.gpu.name
    }

    /// Whether reductions use subgroup arithmetic.
    pub fn uses_subgroups(&self) -> bool {
        self.pipelines.subgroups
    }

    pub fn stats(&self) -> Stats {
        self.exec.stats()
    }

    /// The device's most workgroups per dispatch in x, y and z (`maxComputeWorkGroupCount`): 65535 on lavapipe
    /// and many mobile GPUs (Vulkan's minimum), 2³¹ − 1 in x on NVIDIA's.
    pub fn max_workgroups(&self) -> [u32; 3] {
        self.gpu.limits.max_groups
    }

    pub fn is_enabled(&self, kernel: Kernel) -> bool {
        self.enabled.contains(&kernel)
    }

    /// Whether the device runs `op` with operands of `lens` values ([`Backend::supports`]): its kind on the
    /// device ([`VulkanBackend::supports_kind`]), its weight (one this backend made) and its sizes within the
    /// kernel's and the dispatch's limits. Only the record's plain fields are read.
    pub fn supports_op(&self, r: &OpRecord, lens: [usize; 4]) -> bool {
        if !self.supports_kind(r.kind) {
            return false;
        }
        if r.out == NO_TENSOR {
            // Asked about the kind alone.
            return true;
        }
        // SAFETY: the record's weight is null or a live `Weight` (the trait's contract for ops).
        let Ok(op) = (unsafe { Op::new(r, lens) }) else {
            return false;
        };
        match op.weight {
            // A weighted op: its weight's kernel enabled, its grid within the dispatch limits.
            Some(_) => op
                .encode(&self.gpu.limits)
                .is_some_and(|d| self.is_enabled(d.kernel)),
            None => fits(&op.math, lens, &self.gpu.limits),
        }
    }

    /// Whether ops of this ABI kind run on the device (for some weight format, where the op has weights).
    pub fn supports_kind(&self, kind: u32) -> bool {
        let any = |pred: &dyn Fn(&Kernel) -> bool| self.enabled.iter().any(pred);
        match kind {
            k if k == OpKind::Linear as u32 => {
                any(&|k| matches!(k, Kernel::Matvec(_) | Kernel::Gemm(GemmMode::Linear, _)))
            }
            k if k == OpKind::Conv1d as u32 => {
                any(&|k| matches!(k, Kernel::Gemm(GemmMode::Conv, _)))
            }
            k if k == OpKind::ConvTranspose1d as u32 => {
                any(&|k| matches!(k, Kernel::Gemm(GemmMode::ConvTranspose, _)))
            }
            k if k == OpKind::DepthwiseConv1d as u32 => self.is_enabled(Kernel::Depthwise),
            k if k == OpKind::RmsNorm as u32 => self.is_enabled(Kernel::Norm(NormKind::Rms)),
            k if k == OpKind::LayerNorm as u32 => self.is_enabled(Kernel::Norm(NormKind::Layer)),
            k if k == OpKind::Rope as u32 => self.is_enabled(Kernel::Rope),
            k if k == OpKind::Attention as u32 => self.is_enabled(Kernel::Attention),
            k if k == OpKind::SnakeBeta as u32 => {
                self.is_enabled(Kernel::Eltwise(Activation::SnakeBeta))
            }
            k if k == OpKind::Gelu as u32 => self.is_enabled(Kernel::Eltwise(Activation::Gelu)),
            k if k == OpKind::Silu as u32 => self.is_enabled(Kernel::Eltwise(Activation::Silu)),
            k if k == OpKind::SiluMul as u32 => {
                self.is_enabled(Kernel::Eltwise(Activation::SiluMul))
            }
            k => OpKind::from_code(k)
                .and_then(OpKind::combine)
                .is_some_and(|c| self.is_enabled(Kernel::Strided(c))),
        }
    }

    /// Uploads a weight to the device, when a kernel that uses it passed the self-test and it fits the device's
    /// limits; an error otherwise (the engine then keeps it on its CPU).
    pub fn upload_desc(&self, d: &WeightDesc) -> Result<GpuWeight, String> {
        let data = if d.data_len == 0 {
            &[][..]
        } else if d.data.is_null() {
            return Err("null weight data".into());
        } else {
            // SAFETY: the ABI's contract: `data` holds `data_len` floats for the call.
            unsafe { std::slice::from_raw_parts(d.data, d.data_len) }
        };
        let bias = if d.bias.is_null() {
            None
        } else {
            // SAFETY: as above.
            Some(unsafe { std::slice::from_raw_parts(d.bias, d.bias_len) })
        };
        let n = d.dims.map(|v| usize::try_from(v).unwrap_or(usize::MAX));
        let product = |dims: &[usize]| {
            dims.iter()
                .try_fold(1usize, |acc, &v| acc.checked_mul(v))
                .filter(|&p| p > 0)
                .ok_or_else(|| format!("bad weight dimensions {:?}", d.dims))
        };
        let (expected, bias_len, shape) = match d.kind {
            k if k == WeightKind::Linear as u32 => (
                product(&n[..2])?,
                n[0],
                Shape::Linear {
                    out: n[0],
                    inp: n[1],
                    padded: n[1].div_ceil(32) * 32,
                    has_bias: bias.is_some(),
                },
            ),
            k if k == WeightKind::Conv1d as u32 => (
                product(&n[..3])?,
                n[0],
                Shape::Conv {
                    cout: n[0],
                    cin: n[1],
                    k: n[2],
                },
            ),
            k if k == WeightKind::DepthwiseConv1d as u32 => (
                product(&n[..2])?,
                n[0],
                Shape::Depthwise {
                    channels: n[0],
                    k: n[1],
                },
            ),
            k if k == WeightKind::ConvTranspose1d as u32 => {
                let (k, stride) = (n[2], n[3]);
                if stride == 0 || k < stride {
                    return Err(format!(
                        "a transposed convolution needs 1 ≤ stride ≤ kernel (stride {stride}, kernel {k})"
                    ));
                }
                (
                    product(&n[..3])?,
                    n[1],
                    Shape::ConvTranspose {
                        cin: n[0],
                        cout: n[1],
                        k,
                        stride,
                        taps: k.div_ceil(stride),
                    },
                )
            }
            other => return Err(format!("unknown weight kind {other}")),
        };
        if data.len() != expected {
            return Err(format!(
                "the weight has {} values; its dimensions need {expected}",
                data.len()
            ));
        }
        if let Some(b) = bias {
            if b.len() != bias_len {
                return Err(format!(
                    "the bias has {} values; {bias_len} expected",
                    b.len()
                ));
            }
        }
        let format = WeightFormat::from_code(d.format)
            .ok_or_else(|| format!("unknown weight format {}", d.format))?;
        match self.device_weight(data, bias, shape, format) {
            Some(Ok(w)) => Ok(w.owned_by(&self.exec)),
            Some(Err(e)) => Err(e),
            None => Err(format!(
                "no kernel for this {} weight runs on {}",
                format,
                self.device_name()
            )),
        }
    }

    /// The weight on the device, or `None` when no enabled kernel would use it.
    fn device_weight(
        &self,
        data: &[f32],
        bias: Option<&[f32]>,
        shape: Shape,
        format: WeightFormat,
    ) -> Option<Result<GpuWeight, String>> {
        let conv_format = if self.options.conv_f16 {
            Format::F16
        } else {
            Format::F32
        };
        let full_bias =
            |len: usize| -> Vec<f32> { bias.map_or_else(|| vec![0.0; len], <[f32]>::to_vec) };
        let gpu = &self.gpu;
        match shape {
            Shape::Linear { out, inp, .. } => {
                let f = Format::ALL[format.code() as usize];
                (self.is_enabled(Kernel::Matvec(f))
                    || self.is_enabled(Kernel::Gemm(GemmMode::Linear, f)))
                .then(|| GpuWeight::linear(gpu, data, out, inp, bias, format))
            }
            Shape::Conv { cout, cin, k } => self
                .is_enabled(Kernel::Gemm(GemmMode::Conv, conv_format))
                .then(|| {
                    GpuWeight::conv1d(gpu, data, (cout, cin, k), &full_bias(cout), conv_format)
                }),
            Shape::Depthwise { channels, k } => self
                .is_enabled(Kernel::Depthwise)
                .then(|| GpuWeight::depthwise(gpu, data, channels, k, &full_bias(channels))),
            Shape::ConvTranspose {
                cin,
                cout,
                k,
                stride,
                ..
            } => self
                .is_enabled(Kernel::Gemm(GemmMode::ConvTranspose, conv_format))
                .then(|| {
                    GpuWeight::conv_transpose1d(gpu, data, (cin, cout, k), stride, conv_format)
                }),
        }
    }

    /// A linear weight from the on-disk cache's bytes (`LinearWeight::export`'s format), or `None` when they do
    /// not describe `[out][inp]` in `format` or no kernel of the device uses it.
    pub fn import(
        &self,
        bytes: &[u8],
        out: usize,
        inp: usize,
        format: WeightFormat,
    ) -> Option<GpuWeight> {
        let f = Format::ALL[format.code() as usize];
        if !(self.is_enabled(Kernel::Matvec(f))
            || self.is_enabled(Kernel::Gemm(GemmMode::Linear, f)))
        {
            return None;
        }
        GpuWeight::from_export(&self.gpu, bytes, out, inp, format)
            .ok()
            .map(|w| w.owned_by(&self.exec))
    }

    /// Runs checked ops over `tensors` as one submission; an op past the device's limits is an error (`supports`
    /// refuses it, so the engine runs it on its CPU).
    pub fn run_ops(&self, tensors: &[TensorRecord], ops: &[Op<'_>]) -> Result<(), String> {
        let limits = self.gpu.limits;
        let mut dispatches = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            if op.lens[3] == 0 {
                continue;
            }
            let dispatch = op
                .encode(&limits)
                .filter(|d| self.is_enabled(d.kernel))
                .ok_or_else(|| {
                    format!(
                        "op {i} ({:?}) does not fit the device (`supports` refuses it)",
                        op.math
                    )
                })?;
            dispatches.push(dispatch);
        }
        self.exec.run(&self.pipelines, tensors, dispatches)
    }
}

impl Backend for VulkanBackend {
    fn name(&self) -> &str {
        "vulkan"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Capabilities::LISTS | Capabilities::DEVICE)
    }

    fn upload(&self, weight: WeightData<'_>) -> Result<Weight, String> {
        weight.check()?;
        self.upload_desc(&weight.desc()).map(Weight::new)
    }

    fn supports(&self, op: &OpRecord, lens: [usize; 4]) -> bool {
        self.supports_op(op, lens)
    }

    /// The whole list as one submission.
    unsafe fn run_list(&self, list: List<'_>) -> Result<(), String> {
        let ops = list
            .ops
            .iter()
            .enumerate()
            // SAFETY: every weight is null or a live `Weight` of this backend, kept by the caller for the call
            // (`run_list`'s contract).
            .map(|(i, r)| unsafe { Op::from_record(r, &list) }.map_err(|e| format!("op {i}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        self.run_ops(list.tensors, &ops)
    }

    fn export_linear(&self, w: &Weight) -> Option<Vec<u8>> {
        w.downcast::<GpuWeight>()?.export_linear().ok()
    }

    fn import_linear(
        &self,
        bytes: &[u8],
        out: usize,
        inp: usize,
        format: WeightFormat,
    ) -> Option<Weight> {
        self.import(bytes, out, inp, format).map(Weight::new)
    }
}
