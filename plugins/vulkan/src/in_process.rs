//! [`VulkanBackend`] behind the `Backend` trait, in-process (tests and tools): the same calls the engine makes
//! through the plugin table, with its failures as panics (as the engine's plugin wrapper does).

use kazeia_backend_abi::plugin::{OpRecord, WeightDesc, WeightKind};
use kazeia_backend_abi::{AttentionSpan, Backend, Combine, Heads, Strided, Weight, WeightFormat};

use crate::backend::VulkanBackend;
use crate::ops::{Math, Op};
use crate::weights::VkWeight;

impl VulkanBackend {
    fn upload_desc(
        &self,
        kind: WeightKind,
        format: WeightFormat,
        dims: [usize; 4],
        w: &[f32],
        bias: Option<&[f32]>,
    ) -> Weight {
        let desc = WeightDesc {
            kind: kind as u32,
            format: format.code(),
            dims: dims.map(|d| d as u64),
            data: w.as_ptr(),
            data_len: w.len(),
            bias: bias.map_or(std::ptr::null(), <[f32]>::as_ptr),
            bias_len: bias.map_or(0, <[f32]>::len),
        };
        Weight::new(
            self.upload(&desc)
                .unwrap_or_else(|e| panic!("vulkan: cannot upload a weight: {e}")),
        )
    }

    fn one(
        &self,
        math: Math,
        w: Option<&Weight>,
        a: &[f32],
        b: &[f32],
        c: &[f32],
        out: &mut [f32],
    ) {
        let weight = w.map(|w| {
            w.downcast::<VkWeight>()
                .expect("a weight made by another backend")
        });
        let op = Op {
            math,
            weight,
            a,
            b,
            c,
            out: out.as_mut_ptr(),
            out_len: out.len(),
        };
        if let Err(e) = op.validate().and_then(|()| self.run(&[op], false)) {
            panic!("vulkan: {math:?} failed: {e}");
        }
    }
}

impl Backend for VulkanBackend {
    fn name(&self) -> &str {
        "vulkan"
    }

    fn upload_linear(
        &self,
        w: &[f32],
        out: usize,
        inp: usize,
        bias: Option<&[f32]>,
        format: WeightFormat,
    ) -> Weight {
        self.upload_desc(WeightKind::Linear, format, [out, inp, 0, 0], w, bias)
    }

    fn upload_conv1d(
        &self,
        w: &[f32],
        cout: usize,
        cin: usize,
        k: usize,
        bias: Option<&[f32]>,
    ) -> Weight {
        self.upload_desc(
            WeightKind::Conv1d,
            WeightFormat::F32,
            [cout, cin, k, 0],
            w,
            bias,
        )
    }

    fn upload_depthwise_conv1d(
        &self,
        w: &[f32],
        channels: usize,
        k: usize,
        bias: Option<&[f32]>,
    ) -> Weight {
        self.upload_desc(
            WeightKind::DepthwiseConv1d,
            WeightFormat::F32,
            [channels, k, 0, 0],
            w,
            bias,
        )
    }

    fn upload_conv_transpose1d(
        &self,
        w: &[f32],
        cin: usize,
        cout: usize,
        k: usize,
        stride: usize,
    ) -> Weight {
        self.upload_desc(
            WeightKind::ConvTranspose1d,
            WeightFormat::F32,
            [cin, cout, k, stride],
            w,
            None,
        )
    }

    fn linear(&self, w: &Weight, x: &[f32], rows: usize, y: &mut [f32]) {
        self.one(Math::Linear { rows }, Some(w), x, &[], &[], y);
    }

    fn conv1d(&self, w: &Weight, x: &[f32], len: usize, dilation: usize, y: &mut [f32]) {
        self.one(Math::Conv1d { len, dilation }, Some(w), x, &[], &[], y);
    }

    fn depthwise_conv1d(&self, w: &Weight, x: &[f32], len: usize, y: &mut [f32]) {
        self.one(Math::Depthwise { len }, Some(w), x, &[], &[], y);
    }

    fn conv_transpose1d(&self, w: &Weight, x: &[f32], len: usize, y: &mut [f32]) {
        self.one(Math::ConvTranspose { len }, Some(w), x, &[], &[], y);
    }

    fn rms_norm(&self, x: &mut [f32], dim: usize, weight: &[f32], eps: f32) {
        self.one(Math::RmsNorm { dim, eps }, None, weight, &[], &[], x);
    }

    fn layer_norm(&self, x: &mut [f32], dim: usize, weight: &[f32], bias: &[f32], eps: f32) {
        self.one(Math::LayerNorm { dim, eps }, None, weight, bias, &[], x);
    }

    fn rope(&self, x: &mut [f32], heads: usize, head_dim: usize, start_pos: usize, theta: f32) {
        let math = Math::Rope {
            heads,
            head_dim,
            start_pos,
            theta,
        };
        self.one(math, None, &[], &[], &[], x);
    }

    fn attention(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        heads: Heads,
        span: AttentionSpan,
        scale: f32,
        out: &mut [f32],
    ) {
        self.one(Math::Attention { heads, span, scale }, None, q, k, v, out);
    }

    fn snake_beta(&self, x: &mut [f32], len: usize, alpha: &[f32], inv_beta: &[f32]) {
        self.one(Math::SnakeBeta { len }, None, alpha, inv_beta, &[], x);
    }

    fn gelu(&self, x: &mut [f32]) {
        self.one(Math::Gelu, None, &[], &[], &[], x);
    }

    fn export_linear(&self, w: &Weight) -> Option<Vec<u8>> {
        VulkanBackend::export_linear(self, w.downcast::<VkWeight>()?)
    }

    fn import_linear(
        &self,
        bytes: &[u8],
        out: usize,
        inp: usize,
        format: WeightFormat,
    ) -> Option<Weight> {
        VulkanBackend::import_linear(self, bytes, out, inp, format).map(Weight::new)
    }

    fn silu(&self, x: &mut [f32]) {
        self.one(Math::Silu, None, &[], &[], &[], x);
    }

    fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        self.one(Math::SiluMul, None, up, &[], &[], gate);
    }

    fn prefers_lists(&self) -> bool {
        true
    }

    fn strided(&self, combine: Combine, src: &[f32], dst: &mut [f32], shape: Strided) {
        self.one(Math::Strided { combine, shape }, None, src, &[], &[], dst);
    }

    /// The list as the plugin table would take it: consecutive device ops in one submission.
    unsafe fn run_records(&self, ops: &[OpRecord]) -> Result<(), String> {
        let records: Vec<OpRecord> = ops
            .iter()
            .map(|op| {
                let mut record = *op;
                if let Some(w) = (op.weight as *const Weight).as_ref() {
                    let w = w
                        .downcast::<VkWeight>()
                        .ok_or("a weight made by another backend")?;
                    record.weight = w as *const VkWeight as *const std::ffi::c_void;
                }
                Ok(record)
            })
            .collect::<Result<_, String>>()?;
        VulkanBackend::run_records(self, &records)
    }
}
