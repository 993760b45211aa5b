//! Kazeia's CPU backend: the reference implementation of every op in `kazeia-backend-abi` (the per-op methods
//! of [`CpuBackend`]), and what the engine and the device plugins run the ops on that a device does not take.

mod activations;
#[cfg(target_arch = "aarch64")]
mod activations_arm;
mod aligned;
mod attention;
mod conv;
#[cfg(target_arch = "aarch64")]
mod conv_arm;
mod conv_f16;
mod conv_winograd;
#[cfg(target_arch = "x86_64")]
mod conv_x86;
mod gemm_call;
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
mod int8;
mod linear;
#[cfg(target_arch = "aarch64")]
pub mod linear_arm;
#[cfg(target_arch = "x86_64")]
mod linear_avx2;
#[cfg(target_arch = "x86_64")]
mod linear_avx2_float;
#[cfg(target_arch = "x86_64")]
mod linear_vnni;
#[cfg(target_arch = "x86_64")]
mod linear_x86;
mod norms;
mod par;
pub mod plugin;
pub mod records;

use kazeia_backend_abi::{
    strided_on_host, AttentionSpan, Backend, Capabilities, Combine, Heads, Strided, Weight,
    WeightData, WeightFormat,
};

pub use conv::{ConvPrecision, ConvTransposeWeight, ConvWeight, DepthwiseWeight};
pub use linear::{int8_activations, resident_block_bytes, LinearWeight};

/// Elements below which an op runs inline rather than on the pool.
const PARALLEL_MIN_WORK: usize = 1 << 15;

/// The CPU backend: a fixed-size thread pool that large ops run in; small ones run on the caller's thread.
pub struct CpuBackend {
    pool: rayon::ThreadPool,
    threads: usize,
    /// How the convolutions are computed: exact unless opted out of ([`ConvPrecision`]).
    convs: ConvPrecision,
}

impl CpuBackend {
    /// A backend running its ops on `threads` worker threads (at least one).
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("kazeia-cpu-{i}"))
            .build()
            .expect("cannot start the CPU backend's worker threads");
        // Direct convolutions: as close to the exact result as the official f32 decoder (`codec_truth` tests).
        // `KAZEIA_CONV_WINOGRAD=1` opts into Winograd's faster, less exact ones.
        let convs = if std::env::var("KAZEIA_CONV_WINOGRAD").as_deref() == Ok("1") {
            ConvPrecision::Winograd
        } else {
            ConvPrecision::Exact
        };
        CpuBackend {
            pool,
            threads,
            convs,
        }
    }

    /// This backend with every convolution computed directly (no Winograd, whatever `KAZEIA_CONV_WINOGRAD`
    /// says): each output a fixed sum of products of the weights as stored, as the tests of that property need.
    pub fn with_direct_convolutions(mut self) -> Self {
        self.convs = ConvPrecision::Exact;
        self
    }

    /// This backend with the convolutions that suit it computed by Winograd's F(2, k) (`conv_winograd.rs`): the
    /// decoder's vocoder ~20 % faster, but ~1.5–2× further from the exact waveform than the official f32 decoder
    /// on the tiny fixtures (the default's contract is 1.25×). An opt-in for a fast decoder mode, with its own
    /// bound; `KAZEIA_CONV_WINOGRAD=1` does the same for every backend of a process.
    pub fn with_winograd_convolutions(mut self) -> Self {
        self.convs = ConvPrecision::Winograd;
        self
    }

    /// This backend with its convolutions computed as `precision` says: [`ConvPrecision::Fast`] is the fast
    /// decoder mode (Winograd's F(6, 7) for the vocoder's 7-tap convolutions, F(4, 2) per output phase for its
    /// smaller upsamplers; f16 arithmetic for the 1×1 ones on aarch64 CPUs with FEAT_FP16), not exact, with its
    /// own bound (`engine-core/tests/it/codec_fast.rs`: ≥ 40 dB SNR against the exact decoder).
    pub fn with_conv_precision(mut self, precision: ConvPrecision) -> Self {
        self.convs = precision;
        self
    }

    /// How this backend computes its convolutions.
    pub fn conv_precision(&self) -> ConvPrecision {
        self.convs
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `op(parallel)`: on the pool when there are several threads and `work` elements make a hand-off
    /// worth it, else inline on the caller's thread (sequentially).
    fn run<R: Send>(&self, work: usize, op: impl FnOnce(bool) -> R + Send) -> R {
        if self.threads > 1 && work >= PARALLEL_MIN_WORK {
            self.pool.install(|| op(true))
        } else {
            op(false)
        }
    }

    fn parallelism(&self) -> gemm::Parallelism {
        if self.threads > 1 {
            gemm::Parallelism::Rayon(self.threads)
        } else {
            gemm::Parallelism::None
        }
    }
}

fn expect<'a, T: 'static>(w: &'a Weight, what: &str) -> &'a T {
    w.downcast::<T>().unwrap_or_else(|| {
        panic!("the CPU backend was handed a {what} weight made by another backend")
    })
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn upload(&self, weight: WeightData<'_>) -> Result<Weight, String> {
        weight.check()?;
        Ok(match weight {
            WeightData::Linear {
                w,
                out,
                inp,
                bias,
                format,
            } => Weight::new(LinearWeight::new(w, out, inp, bias, format)),
            WeightData::Conv1d {
                w,
                cout,
                cin,
                k,
                bias,
                format,
            } => Weight::new(ConvWeight::with_precision(
                w,
                (cout, cin, k),
                bias,
                format,
                self.convs,
            )),
            WeightData::DepthwiseConv1d {
                w,
                channels,
                k,
                bias,
            } => Weight::new(DepthwiseWeight::new(w, channels, k, bias)),
            WeightData::ConvTranspose1d {
                w,
                cin,
                cout,
                k,
                stride,
                format,
            } => Weight::new(ConvTransposeWeight::with_precision(
                w,
                (cin, cout, k),
                stride,
                format,
                self.convs,
            )),
        })
    }

    /// Lists: a whole stage enters the worker threads once, and its ops share them from there (op by op, each
    /// op's hand-off to the pool and back would put the calling thread to sleep and wake it again).
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Capabilities::LISTS)
    }

    /// Each op in turn through [`records::run_op`] on the worker threads (entered once for the list, the idle
    /// ones spinning for its parallel ops: `par::with_spinning_helpers`), intermediate results allocated from
    /// their first op to their last.
    unsafe fn run_list(&self, list: kazeia_backend_abi::list::List<'_>) -> Result<(), String> {
        /// The list, handed to a worker thread while the caller waits for it.
        struct Handed<'a>(kazeia_backend_abi::list::List<'a>);
        // SAFETY: the list's memory is valid and unshared for this call (the method's contract), and the calling
        // thread blocks in `install` until the worker is done with it.
        unsafe impl Send for Handed<'_> {}
        impl<'a> Handed<'a> {
            /// The list (a method, so that a closure takes the whole `Handed`, not its field).
            fn list(self) -> kazeia_backend_abi::list::List<'a> {
                self.0
            }
        }
        let handed = Handed(list);
        let run = move || {
            let list = handed.list();
            // SAFETY: the list follows `run_list`'s rules (this method's contract).
            unsafe { records::run_list(self, list) }
        };
        if self.threads > 1 {
            self.pool
                .install(|| par::with_spinning_helpers(self.threads - 1, run))
        } else {
            run()
        }
    }

    fn export_linear(&self, w: &Weight) -> Option<Vec<u8>> {
        w.downcast::<LinearWeight>().map(LinearWeight::export)
    }

    fn import_linear(
        &self,
        bytes: &[u8],
        out: usize,
        inp: usize,
        format: WeightFormat,
    ) -> Option<Weight> {
        LinearWeight::import(bytes, out, inp, format).map(Weight::new)
    }
}

/// The ops, on host slices: what [`plugin::OpKind`](kazeia_backend_abi::plugin::OpKind) documents for each record
/// kind. The engine reaches them through op lists ([`Backend::run_list`]); the Hexagon plugin calls them for
/// what its device does not run.
impl CpuBackend {
    /// `y[rows][out] = x[rows][in] · wᵀ + bias`.
    pub fn linear(&self, w: &Weight, x: &[f32], rows: usize, y: &mut [f32]) {
        let w = expect::<LinearWeight>(w, "linear");
        let par = self.parallelism();
        self.run(w.macs(rows), |parallel| {
            let par = if parallel {
                par
            } else {
                gemm::Parallelism::None
            };
            w.forward(x, rows, y, par)
        });
    }

    /// Valid (unpadded) dilated convolution: `x[cin][len]` → `y[cout][len - (k-1)·dilation]`, bias added.
    pub fn conv1d(&self, w: &Weight, x: &[f32], len: usize, dilation: usize, y: &mut [f32]) {
        let w = expect::<ConvWeight>(w, "conv1d");
        let par = self.parallelism();
        self.run(y.len() * 64, |parallel| {
            let par = if parallel {
                par
            } else {
                gemm::Parallelism::None
            };
            w.forward(x, len, dilation, y, par)
        });
    }

    /// Valid depthwise convolution, dilation 1: `x[c][len]` → `y[c][len - (k-1)]`, bias added.
    pub fn depthwise_conv1d(&self, w: &Weight, x: &[f32], len: usize, y: &mut [f32]) {
        let w = expect::<DepthwiseWeight>(w, "depthwise conv1d");
        self.run(y.len() * 8, |parallel| w.forward(parallel, x, len, y));
    }

    /// Full transposed convolution without bias: `x[cin][len]` → `y[cout][(len-1)·stride + k]` (overwritten).
    pub fn conv_transpose1d(&self, w: &Weight, x: &[f32], len: usize, y: &mut [f32]) {
        let w = expect::<ConvTransposeWeight>(w, "transposed conv1d");
        let par = self.parallelism();
        self.run(y.len() * 64, |parallel| {
            let par = if parallel {
                par
            } else {
                gemm::Parallelism::None
            };
            w.forward(x, len, y, par)
        });
    }

    /// In-place RMSNorm of each `dim`-wide row: `x · rsqrt(mean(x²) + eps) · weight`.
    pub fn rms_norm(&self, x: &mut [f32], dim: usize, weight: &[f32], eps: f32) {
        self.run(x.len(), |parallel| {
            norms::rms_norm(parallel, x, dim, weight, eps)
        });
    }

    /// In-place LayerNorm of each `dim`-wide row (biased variance), with affine `weight`, `bias`.
    pub fn layer_norm(&self, x: &mut [f32], dim: usize, weight: &[f32], bias: &[f32], eps: f32) {
        self.run(x.len(), |parallel| {
            norms::layer_norm(parallel, x, dim, weight, bias, eps)
        });
    }

    /// In-place rotary embedding, split-half ("NeoX") pairing, on `x[rows][heads][head_dim]` where row `r` is at
    /// position `start_pos + r`.
    pub fn rope(&self, x: &mut [f32], heads: usize, head_dim: usize, start_pos: usize, theta: f32) {
        attention::rope(x, heads, head_dim, start_pos, theta);
    }

    /// Causal softmax attention with scale `scale`; writes `out[queries][q_heads][head_dim]`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        heads: Heads,
        span: AttentionSpan,
        scale: f32,
        out: &mut [f32],
    ) {
        let work = span.queries * span.keys * heads.q_heads * heads.head_dim;
        self.run(work, |parallel| {
            attention::attention(parallel, q, k, v, heads, span, scale, out)
        });
    }

    /// In-place SnakeBeta on `x[channels][len]`: `x + inv_beta[c] · sin(alpha[c] · x)²`, with `alpha` and
    /// `inv_beta` already exponentiated / inverted by the caller.
    pub fn snake_beta(&self, x: &mut [f32], len: usize, alpha: &[f32], inv_beta: &[f32]) {
        self.run(x.len() * 8, |parallel| {
            activations::snake_beta(parallel, x, len, alpha, inv_beta)
        });
    }

    /// In-place exact (erf) GELU.
    pub fn gelu(&self, x: &mut [f32]) {
        self.run(x.len() * 8, |parallel| activations::gelu(parallel, x));
    }

    /// In-place SiLU, `x · sigmoid(x)`.
    pub fn silu(&self, x: &mut [f32]) {
        self.run(x.len() * 4, |parallel| activations::silu(parallel, x));
    }

    /// In-place `gate = silu(gate) · up` (the SwiGLU product).
    pub fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        self.run(gate.len() * 4, |parallel| {
            activations::silu_mul(parallel, gate, up)
        });
    }

    /// `dst[view] = src[view]` (or `+=`, `×=`) element by element over `shape`: copies, transposes,
    /// concatenation, residual adds, per-channel scales and biases (zero strides). `shape` must pass
    /// [`Strided::check`](kazeia_backend_abi::Strided::check).
    pub fn strided(&self, combine: Combine, src: &[f32], dst: &mut [f32], shape: Strided) {
        strided_on_host(combine, src, dst, shape);
    }
}
