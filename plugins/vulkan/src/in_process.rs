//! [`VulkanBackend`] behind the `Backend` trait, in-process (tests and tools): the records the engine's plugin
//! wrapper would send through the plugin table, with its failures as panics (as that wrapper does).

use kazeia_backend_abi::plugin::{OpKind, OpRecord, WeightDesc};
use kazeia_backend_abi::{
    AttentionSpan, Backend, Capabilities, Combine, Heads, Strided, Weight, WeightFormat,
};

use crate::backend::VulkanBackend;
use crate::weights::VkWeight;

impl VulkanBackend {
    fn upload_desc(&self, desc: WeightDesc) -> Weight {
        Weight::new(
            self.upload(&desc)
                .unwrap_or_else(|e| panic!("vulkan: cannot upload a weight: {e}")),
        )
    }

    /// Runs one record made with `*const Weight` weights.
    fn one(&self, op: OpRecord) {
        // SAFETY: the record's buffers are the caller's live slices.
        if let Err(e) = unsafe { Backend::run_records(self, std::slice::from_ref(&op)) } {
            panic!("vulkan: op {} failed: {e}", op.kind);
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
        self.upload_desc(WeightDesc::linear(w, out, inp, bias, format))
    }

    fn upload_conv1d(
        &self,
        w: &[f32],
        cout: usize,
        cin: usize,
        k: usize,
        bias: Option<&[f32]>,
    ) -> Weight {
        self.upload_desc(WeightDesc::conv1d(w, cout, cin, k, bias))
    }

    fn upload_depthwise_conv1d(
        &self,
        w: &[f32],
        channels: usize,
        k: usize,
        bias: Option<&[f32]>,
    ) -> Weight {
        self.upload_desc(WeightDesc::depthwise_conv1d(w, channels, k, bias))
    }

    fn upload_conv_transpose1d(
        &self,
        w: &[f32],
        cin: usize,
        cout: usize,
        k: usize,
        stride: usize,
    ) -> Weight {
        self.upload_desc(WeightDesc::conv_transpose1d(w, cin, cout, k, stride))
    }

    fn linear(&self, w: &Weight, x: &[f32], rows: usize, y: &mut [f32]) {
        self.one(OpRecord::weighted(OpKind::Linear, w, x, y, [rows, 0]));
    }

    fn conv1d(&self, w: &Weight, x: &[f32], len: usize, dilation: usize, y: &mut [f32]) {
        self.one(OpRecord::weighted(OpKind::Conv1d, w, x, y, [len, dilation]));
    }

    fn depthwise_conv1d(&self, w: &Weight, x: &[f32], len: usize, y: &mut [f32]) {
        self.one(OpRecord::weighted(
            OpKind::DepthwiseConv1d,
            w,
            x,
            y,
            [len, 0],
        ));
    }

    fn conv_transpose1d(&self, w: &Weight, x: &[f32], len: usize, y: &mut [f32]) {
        self.one(OpRecord::weighted(
            OpKind::ConvTranspose1d,
            w,
            x,
            y,
            [len, 0],
        ));
    }

    fn rms_norm(&self, x: &mut [f32], dim: usize, weight: &[f32], eps: f32) {
        self.one(OpRecord::in_place(
            OpKind::RmsNorm,
            x,
            weight,
            &[],
            [dim, 0, 0],
            eps,
        ));
    }

    fn layer_norm(&self, x: &mut [f32], dim: usize, weight: &[f32], bias: &[f32], eps: f32) {
        self.one(OpRecord::in_place(
            OpKind::LayerNorm,
            x,
            weight,
            bias,
            [dim, 0, 0],
            eps,
        ));
    }

    fn rope(&self, x: &mut [f32], heads: usize, head_dim: usize, start_pos: usize, theta: f32) {
        let n = [heads, head_dim, start_pos];
        self.one(OpRecord::in_place(OpKind::Rope, x, &[], &[], n, theta));
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
        self.one(OpRecord::attention(q, k, v, heads, span, scale, out));
    }

    fn snake_beta(&self, x: &mut [f32], len: usize, alpha: &[f32], inv_beta: &[f32]) {
        self.one(OpRecord::in_place(
            OpKind::SnakeBeta,
            x,
            alpha,
            inv_beta,
            [len, 0, 0],
            0.0,
        ));
    }

    fn gelu(&self, x: &mut [f32]) {
        self.one(OpRecord::in_place(OpKind::Gelu, x, &[], &[], [0; 3], 0.0));
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
        self.one(OpRecord::in_place(OpKind::Silu, x, &[], &[], [0; 3], 0.0));
    }

    fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        self.one(OpRecord::in_place(
            OpKind::SiluMul,
            gate,
            up,
            &[],
            [0; 3],
            0.0,
        ));
    }

    fn supports(&self, op: &OpRecord) -> bool {
        self.supports_record(op)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Capabilities::LISTS)
    }

    fn strided(&self, combine: Combine, src: &[f32], dst: &mut [f32], shape: Strided) {
        if let Err(e) = shape.check(src.len(), dst.len()) {
            panic!("{e}");
        }
        let dst_len = dst.len();
        self.one(OpRecord::strided(
            combine,
            src,
            dst.as_mut_ptr(),
            dst_len,
            shape,
        ));
    }

    /// The list as the plugin table would take it: consecutive device ops in one submission.
    unsafe fn run_records(&self, ops: &[OpRecord]) -> Result<(), String> {
        let records: Vec<OpRecord> = ops
            .iter()
            .map(|op| {
                let mut record = *op;
                // SAFETY: null or a live `Weight` of this backend (`run_records`'s contract).
                if let Some(w) = unsafe { (op.weight as *const Weight).as_ref() } {
                    let w = w
                        .downcast::<VkWeight>()
                        .ok_or("a weight made by another backend")?;
                    record.weight = w as *const VkWeight as *const std::ffi::c_void;
                }
                Ok(record)
            })
            .collect::<Result<_, String>>()?;
        // SAFETY: the same buffers as `ops` (valid by this method's contract), each weight now this backend's
        // `VkWeight`.
        unsafe { VulkanBackend::run_records(self, &records) }
    }
}
