//! Kazeia's CPU backend: the reference implementation of every op in `kazeia-backend-abi`.

mod activations;
#[cfg(target_arch = "aarch64")]
mod activations_arm;
mod attention;
mod conv;
mod gemm_call;
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
mod int8;
mod linear;
#[cfg(target_arch = "aarch64")]
pub mod linear_arm;
#[cfg(target_arch = "x86_64")]
mod linear_x86;
mod norms;
mod par;
pub mod plugin;

use kazeia_backend_abi::{AttentionSpan, Backend, Heads, Weight, WeightFormat};

pub use conv::{ConvTransposeWeight, ConvWeight, DepthwiseWeight};
pub use linear::LinearWeight;

/// Elements below which an op runs inline rather than on the pool.
const PARALLEL_MIN_WORK: usize = 1 << 15;

/// The CPU backend: a fixed-size thread pool that large ops run in; small ones run on the caller's thread.
pub struct CpuBackend {
    pool: rayon::ThreadPool,
    threads: usize,
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
        CpuBackend { pool, threads }
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

    fn upload_linear(
        &self,
        w: &[f32],
        out_features: usize,
        in_features: usize,
        bias: Option<&[f32]>,
        format: WeightFormat,
    ) -> Weight {
        Weight::new(LinearWeight::new(
            w,
            out_features,
            in_features,
            bias,
            format,
        ))
    }

    fn upload_conv1d(
        &self,
        w: &[f32],
        cout: usize,
        cin: usize,
        k: usize,
        bias: Option<&[f32]>,
    ) -> Weight {
        Weight::new(ConvWeight::new(w, cout, cin, k, bias))
    }

    fn upload_depthwise_conv1d(
        &self,
        w: &[f32],
        channels: usize,
        k: usize,
        bias: Option<&[f32]>,
    ) -> Weight {
        Weight::new(DepthwiseWeight::new(w, channels, k, bias))
    }

    fn upload_conv_transpose1d(
        &self,
        w: &[f32],
        cin: usize,
        cout: usize,
        k: usize,
        stride: usize,
    ) -> Weight {
        Weight::new(ConvTransposeWeight::new(w, cin, cout, k, stride))
    }

    fn linear(&self, w: &Weight, x: &[f32], rows: usize, y: &mut [f32]) {
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

    fn conv1d(&self, w: &Weight, x: &[f32], len: usize, dilation: usize, y: &mut [f32]) {
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

    fn depthwise_conv1d(&self, w: &Weight, x: &[f32], len: usize, y: &mut [f32]) {
        let w = expect::<DepthwiseWeight>(w, "depthwise conv1d");
        self.run(y.len() * 8, |parallel| w.forward(parallel, x, len, y));
    }

    fn conv_transpose1d(&self, w: &Weight, x: &[f32], len: usize, y: &mut [f32]) {
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

    fn rms_norm(&self, x: &mut [f32], dim: usize, weight: &[f32], eps: f32) {
        self.run(x.len(), |parallel| {
            norms::rms_norm(parallel, x, dim, weight, eps)
        });
    }

    fn layer_norm(&self, x: &mut [f32], dim: usize, weight: &[f32], bias: &[f32], eps: f32) {
        self.run(x.len(), |parallel| {
            norms::layer_norm(parallel, x, dim, weight, bias, eps)
        });
    }

    fn rope(&self, x: &mut [f32], heads: usize, head_dim: usize, start_pos: usize, theta: f32) {
        attention::rope(x, heads, head_dim, start_pos, theta);
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
        let work = span.queries * span.keys * heads.q_heads * heads.head_dim;
        self.run(work, |parallel| {
            attention::attention(parallel, q, k, v, heads, span, scale, out)
        });
    }

    fn snake_beta(&self, x: &mut [f32], len: usize, alpha: &[f32], inv_beta: &[f32]) {
        self.run(x.len() * 8, |parallel| {
            activations::snake_beta(parallel, x, len, alpha, inv_beta)
        });
    }

    fn gelu(&self, x: &mut [f32]) {
        self.run(x.len() * 8, |parallel| activations::gelu(parallel, x));
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

    fn silu(&self, x: &mut [f32]) {
        self.run(x.len() * 4, |parallel| activations::silu(parallel, x));
    }

    fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        self.run(gate.len() * 4, |parallel| {
            activations::silu_mul(parallel, gate, up)
        });
    }
}
