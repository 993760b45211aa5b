//! The interface between Kazeia's model code and its compute backends.
//!
//! Layout conventions, shared by every op:
//! - *row-major sequences* `x[rows][features]` for linear layers, norms and attention;
//! - *channel-major signals* `x[channels][len]` for convolutions and Snake activations (PyTorch's `[C, T]` with
//!   batch 1).
//!
//! Weights are uploaded once in PyTorch's own layout (`Linear` `[out, in]`, `Conv1d` `[cout, cin, k]`,
//! `ConvTranspose1d` `[cin, cout, k]`) and come back as opaque [`Weight`] handles in whatever layout the backend
//! prefers.

pub mod exports;
pub mod plugin;
pub mod records;
mod strided;

use std::any::Any;

pub use strided::{strided_on_host, Combine, Strided, View};

/// A weight resident in a backend, in a layout only that backend knows.
pub struct Weight {
    inner: Box<dyn Any + Send + Sync>,
}

impl Weight {
    pub fn new<T: Any + Send + Sync>(inner: T) -> Self {
        Weight {
            inner: Box::new(inner),
        }
    }

    /// The backend's own view of the weight; `None` if another backend made it.
    pub fn downcast<T: Any>(&self) -> Option<&T> {
        self.inner.downcast_ref::<T>()
    }
}

/// How a backend stores a linear layer's weights (quantised formats are made from the `f32` values at upload).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    #[default]
    F32,
    F16,
    BF16,
    /// Blocks of 32 weights: one scale and 32 signed bytes (as ggml's Q8_0).
    Q8_0,
    /// Blocks of 32 weights: one scale and 32 signed nibbles, value = (nibble − 8) · scale (as ggml's Q4_0).
    Q4_0,
}

impl WeightFormat {
    /// The code used across the plugin ABI.
    pub fn code(self) -> u32 {
        match self {
            WeightFormat::F32 => 0,
            WeightFormat::F16 => 1,
            WeightFormat::BF16 => 2,
            WeightFormat::Q8_0 => 3,
            WeightFormat::Q4_0 => 4,
        }
    }

    pub fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            0 => WeightFormat::F32,
            1 => WeightFormat::F16,
            2 => WeightFormat::BF16,
            3 => WeightFormat::Q8_0,
            4 => WeightFormat::Q4_0,
            _ => return None,
        })
    }
}

impl std::str::FromStr for WeightFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(WeightFormat::F32),
            "f16" => Ok(WeightFormat::F16),
            "bf16" => Ok(WeightFormat::BF16),
            "q8_0" | "q8" => Ok(WeightFormat::Q8_0),
            "q4_0" | "q4" => Ok(WeightFormat::Q4_0),
            other => Err(format!(
                "unknown weight format `{other}` (expected f32, f16, bf16, q8_0 or q4_0)"
            )),
        }
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WeightFormat::F32 => "f32",
            WeightFormat::F16 => "f16",
            WeightFormat::BF16 => "bf16",
            WeightFormat::Q8_0 => "q8_0",
            WeightFormat::Q4_0 => "q4_0",
        })
    }
}

/// Where attention may look: keys at absolute positions `key_start..key_start + keys`, queries at
/// `query_start..query_start + queries`. A key is visible to a query when it is not in the future and, with a
/// sliding window `w`, when `query_pos - key_pos < w`.
#[derive(Clone, Copy, Debug)]
pub struct AttentionSpan {
    pub queries: usize,
    pub query_start: usize,
    pub keys: usize,
    pub key_start: usize,
    pub window: Option<usize>,
}

/// Head layout of one attention call: `q[queries][q_heads][head_dim]`, `k`/`v[keys][kv_heads][head_dim]`
/// (grouped-query attention when `kv_heads < q_heads`).
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// What a backend is beyond the ops it runs: typed, asked once when the engine takes the backend (C layout: it
/// crosses the plugin table as [`plugin::PluginApi::capabilities`]'s result).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// [`Capabilities::LISTS`], …; bits the engine does not know are ignored.
    pub flags: u64,
}

impl Capabilities {
    /// The backend gains from receiving a whole stage as one list (a device: one submission, results kept on the
    /// device between ops). The engine then holds ops back until a result is needed; otherwise it hands each op
    /// over at once and frees intermediate results as soon as they are dead.
    pub const LISTS: u64 = 1;

    pub const fn new(flags: u64) -> Self {
        Capabilities { flags }
    }

    /// [`Capabilities::LISTS`].
    pub fn lists(self) -> bool {
        self.flags & Self::LISTS != 0
    }
}

/// A compute backend: uploads weights once, then runs ops on host activations.
pub trait Backend: Send + Sync {
    /// Short name shown to users ("cpu", "vulkan", …).
    fn name(&self) -> &str;

    /// `Linear`: `w[out][in]`, optional `bias[out]`, stored as `format`.
    fn upload_linear(
        &self,
        w: &[f32],
        out_features: usize,
        in_features: usize,
        bias: Option<&[f32]>,
        format: WeightFormat,
    ) -> Weight;
    /// `Conv1d` (groups = 1): `w[cout][cin][k]`, optional `bias[cout]`.
    fn upload_conv1d(
        &self,
        w: &[f32],
        cout: usize,
        cin: usize,
        k: usize,
        bias: Option<&[f32]>,
    ) -> Weight;
    /// Depthwise `Conv1d` (groups = channels): `w[c][1][k]`, optional `bias[c]`.
    fn upload_depthwise_conv1d(
        &self,
        w: &[f32],
        channels: usize,
        k: usize,
        bias: Option<&[f32]>,
    ) -> Weight;
    /// `ConvTranspose1d`: `w[cin][cout][k]`, `stride`. The bias stays with the caller (see
    /// [`Backend::conv_transpose1d`]).
    fn upload_conv_transpose1d(
        &self,
        w: &[f32],
        cin: usize,
        cout: usize,
        k: usize,
        stride: usize,
    ) -> Weight;

    /// `y[rows][out] = x[rows][in] · wᵀ + bias`.
    fn linear(&self, w: &Weight, x: &[f32], rows: usize, y: &mut [f32]);
    /// Valid (unpadded) dilated convolution: `x[cin][len]` → `y[cout][len - (k-1)·dilation]`, bias added.
    /// Callers pad on the left (causal) or pass the previous chunk's tail (streaming).
    fn conv1d(&self, w: &Weight, x: &[f32], len: usize, dilation: usize, y: &mut [f32]);
    /// Valid depthwise convolution, dilation 1: `x[c][len]` → `y[c][len - (k-1)]`, bias added.
    fn depthwise_conv1d(&self, w: &Weight, x: &[f32], len: usize, y: &mut [f32]);
    /// Full transposed convolution without bias: `x[cin][len]` → `y[cout][(len-1)·stride + k]` (overwritten).
    /// Without the bias the overlapping tail can be carried to the next chunk and summed.
    fn conv_transpose1d(&self, w: &Weight, x: &[f32], len: usize, y: &mut [f32]);

    /// In-place RMSNorm of each `dim`-wide row: `x · rsqrt(mean(x²) + eps) · weight`.
    fn rms_norm(&self, x: &mut [f32], dim: usize, weight: &[f32], eps: f32);
    /// In-place LayerNorm of each `dim`-wide row (biased variance), with affine `weight`, `bias`.
    fn layer_norm(&self, x: &mut [f32], dim: usize, weight: &[f32], bias: &[f32], eps: f32);
    /// In-place rotary embedding, split-half ("NeoX") pairing, on `x[rows][heads][head_dim]` where row `r` is at
    /// position `start_pos + r`.
    fn rope(&self, x: &mut [f32], heads: usize, head_dim: usize, start_pos: usize, theta: f32);
    /// Causal softmax attention with scale `scale`; writes `out[queries][q_heads][head_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        heads: Heads,
        span: AttentionSpan,
        scale: f32,
        out: &mut [f32],
    );

    /// In-place SnakeBeta on `x[channels][len]`: `x + inv_beta[c] · sin(alpha[c] · x)²`, with `alpha` and
    /// `inv_beta` already exponentiated / inverted by the caller.
    fn snake_beta(&self, x: &mut [f32], len: usize, alpha: &[f32], inv_beta: &[f32]);
    /// In-place exact (erf) GELU.
    fn gelu(&self, x: &mut [f32]);
    /// The resident bytes of a linear weight this backend made, for an on-disk cache; `None` if the backend
    /// does not support caching.
    fn export_linear(&self, _w: &Weight) -> Option<Vec<u8>> {
        None
    }

    /// A linear weight back from [`Backend::export_linear`]'s bytes, if they are this backend's and describe
    /// `w[out][in]` in `format`; `None` otherwise (the caller then uploads from the checkpoint).
    fn import_linear(
        &self,
        _bytes: &[u8],
        _out: usize,
        _inp: usize,
        _format: WeightFormat,
    ) -> Option<Weight> {
        None
    }

    /// In-place SiLU, `x · sigmoid(x)`.
    fn silu(&self, x: &mut [f32]);
    /// In-place `gate = silu(gate) · up` (the SwiGLU product).
    fn silu_mul(&self, gate: &mut [f32], up: &[f32]);

    /// `dst[view] = src[view]` (or `+=`, `×=`) element by element over `shape`: copies, transposes,
    /// concatenation, residual adds, per-channel scales and biases (zero strides). `shape` must pass
    /// [`Strided::check`].
    fn strided(&self, combine: Combine, src: &[f32], dst: &mut [f32], shape: Strided) {
        strided_on_host(combine, src, dst, shape);
    }

    /// Whether this backend runs `op`, judged by what the record says about it: its kind, the lengths of its
    /// buffers, its sizes (`n`), parameters (`f`) and weight (one this backend made, so its shape and format are
    /// the backend's to read). The buffers themselves are not read (their pointers may be null). The engine asks
    /// before it hands a record over and runs what is refused on its own CPU backend; a weighted op it cannot
    /// move there (the weight is this backend's), so a backend answers for weighted kinds it runs at all. For a
    /// hint ([`plugin::OpKind::is_hint`]), whether the backend wants it. By default every known kind (the CPU).
    fn supports(&self, op: &plugin::OpRecord) -> bool {
        plugin::OpKind::from_code(op.kind).is_some()
    }

    /// What the backend is beyond its ops ([`Capabilities`]); none by default (a CPU backend).
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Runs a list of ops in order — a whole stage, so a device backend can submit it at once and keep the
    /// results that later ops read on the device. Each record's weight is a `*const Weight` this backend made.
    /// The default runs them one by one through the methods above.
    ///
    /// # Safety
    /// Every record's pointers must be valid for their lengths for the call, no op's output may overlap its own
    /// inputs, and every weight must be null or a live `Weight` this backend made.
    unsafe fn run_records(&self, ops: &[plugin::OpRecord]) -> Result<(), String> {
        for (i, op) in ops.iter().enumerate() {
            // SAFETY: the record's pointers are valid and its output is disjoint from its inputs (this method's
            // contract); its weight is one this backend made.
            unsafe { records::run_record(self, op) }.map_err(|e| format!("op {i}: {e}"))?;
        }
        Ok(())
    }
}
