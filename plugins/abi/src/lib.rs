//! The interface between Kazeia's model code and its compute backends.
//!
//! Layout conventions, shared by every op:
//! - *row-major sequences* `x[rows][features]` for linear layers, norms and attention;
//! - *channel-major signals* `x[channels][len]` for convolutions and Snake activations (PyTorch's `[C, T]` with
//!   batch 1).
//!
//! Weights are uploaded once in PyTorch's own layout (`Linear` `[out, in]`, `Conv1d` `[cout, cin, k]`,
//! `ConvTranspose1d` `[cin, cout, k]`: [`WeightData`]) and come back as opaque [`Weight`] handles in whatever
//! layout the backend prefers. Ops then reach a backend only as lists ([`list::List`]: [`list::OpRecord`]s over a
//! table of [`list::TensorRecord`]s, [`Backend::run_list`]); what each op computes is documented on
//! [`plugin::OpKind`].

pub mod exports;
pub mod list;
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
    /// device between ops; the CPU: one hand-off to its worker threads). The engine then holds ops back until a
    /// result is needed; otherwise it hands each op over at once and frees intermediate results as soon as they
    /// are dead.
    pub const LISTS: u64 = 1;
    /// The backend's memory is not the host's (a device): intermediate results live there, so a list may hold
    /// many of them. For a backend without it, the engine keeps lists small in bytes, so that host memory holds
    /// no more intermediate results at once than op by op would.
    pub const DEVICE: u64 = 2;

    pub const fn new(flags: u64) -> Self {
        Capabilities { flags }
    }

    /// [`Capabilities::LISTS`].
    pub fn lists(self) -> bool {
        self.flags & Self::LISTS != 0
    }

    /// [`Capabilities::DEVICE`].
    pub fn device(self) -> bool {
        self.flags & Self::DEVICE != 0
    }
}

/// A weight to upload, in PyTorch's layout (see the crate's conventions), borrowed for the call.
#[derive(Clone, Copy, Debug)]
pub enum WeightData<'a> {
    /// `Linear`: `w[out][inp]`, optional `bias[out]`, stored as `format`.
    Linear {
        w: &'a [f32],
        out: usize,
        inp: usize,
        bias: Option<&'a [f32]>,
        format: WeightFormat,
    },
    /// `Conv1d` (groups = 1): `w[cout][cin][k]`, optional `bias[cout]`. `format` is F32, or F16: the backend
    /// may then hold the weight at half precision (the CPU backend does; a device may keep it in f32).
    Conv1d {
        w: &'a [f32],
        cout: usize,
        cin: usize,
        k: usize,
        bias: Option<&'a [f32]>,
        format: WeightFormat,
    },
    /// Depthwise `Conv1d` (groups = channels): `w[channels][1][k]`, optional `bias[channels]`.
    DepthwiseConv1d {
        w: &'a [f32],
        channels: usize,
        k: usize,
        bias: Option<&'a [f32]>,
    },
    /// `ConvTranspose1d`: `w[cin][cout][k]`, `stride`. The bias stays with the caller: the op writes the full
    /// transposed convolution without it, of which the caller keeps the columns it needs (the codec streams on
    /// carried input columns and keeps the positions of the new ones).
    /// `format` as for [`WeightData::Conv1d`].
    ConvTranspose1d {
        w: &'a [f32],
        cin: usize,
        cout: usize,
        k: usize,
        stride: usize,
        format: WeightFormat,
    },
}

impl WeightData<'_> {
    /// Whether the values agree with the dimensions, the bias (if any) with the outputs, the stride is at
    /// least 1 and a convolution's format is F32 or F16.
    pub fn check(&self) -> Result<(), String> {
        match *self {
            WeightData::Conv1d { format, .. } | WeightData::ConvTranspose1d { format, .. }
                if !matches!(format, WeightFormat::F32 | WeightFormat::F16) =>
            {
                return Err(format!("a convolution is held as f32 or f16, not {format}"));
            }
            _ => {}
        }
        let (w, count, bias, outputs) = match *self {
            WeightData::Linear {
                w, out, inp, bias, ..
            } => (w, out.checked_mul(inp), bias, out),
            WeightData::Conv1d {
                w,
                cout,
                cin,
                k,
                bias,
                ..
            } => (
                w,
                cout.checked_mul(cin).and_then(|v| v.checked_mul(k)),
                bias,
                cout,
            ),
            WeightData::DepthwiseConv1d {
                w,
                channels,
                k,
                bias,
            } => (w, channels.checked_mul(k), bias, channels),
            WeightData::ConvTranspose1d {
                w,
                cin,
                cout,
                k,
                stride,
                ..
            } => {
                if stride == 0 {
                    return Err("a transposed convolution with stride 0".into());
                }
                (
                    w,
                    cin.checked_mul(cout).and_then(|v| v.checked_mul(k)),
                    None,
                    cout,
                )
            }
        };
        if count != Some(w.len()) {
            return Err(format!(
                "the weight has {} values; its dimensions {:?} need another count",
                w.len(),
                self.dims()
            ));
        }
        match bias {
            Some(b) if b.len() != outputs => Err(format!(
                "the bias has {} values; {outputs} expected",
                b.len()
            )),
            _ => Ok(()),
        }
    }

    /// The dimensions as the plugin ABI orders them ([`plugin::WeightKind`]).
    pub fn dims(&self) -> [usize; 4] {
        match *self {
            WeightData::Linear { out, inp, .. } => [out, inp, 0, 0],
            WeightData::Conv1d { cout, cin, k, .. } => [cout, cin, k, 0],
            WeightData::DepthwiseConv1d { channels, k, .. } => [channels, k, 0, 0],
            WeightData::ConvTranspose1d {
                cin,
                cout,
                k,
                stride,
                ..
            } => [cin, cout, k, stride],
        }
    }
}

/// A compute backend, as the engine sees every one of them: it uploads weights once (into its own layout),
/// says per op — with its sizes and weight — whether it runs it, and runs lists of ops over a table of tensors
/// ([`list::List`]). What each op computes is documented on [`plugin::OpKind`]; the CPU crate
/// (`kazeia-backend-cpu`) is its reference implementation and where the engine runs what a backend refuses.
pub trait Backend: Send + Sync {
    /// Short name shown to users ("cpu", "vulkan", …).
    fn name(&self) -> &str;

    /// What the backend is beyond its ops ([`Capabilities`]); none by default (a CPU backend).
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Uploads a weight into the backend's own layout ([`WeightData::check`]ed); an error when the data are
    /// inconsistent or the backend cannot hold the weight.
    fn upload(&self, weight: WeightData<'_>) -> Result<Weight, String>;

    /// Whether this backend runs `op` with operands of `lens` values (`a`, `b`, `c`, output; 0 where absent),
    /// judged by its kind, sizes (`n`), parameters (`f`) and weight (one this backend made, so its shape and
    /// format are the backend's to read). The engine asks before it hands an op over and runs what is refused
    /// on its own CPU backend; a weighted op it can move there only when the weight is held there, so a backend
    /// answers for the weighted ops it runs at all. An op whose output is [`list::NO_TENSOR`] asks about its kind
    /// alone (the engine asks once per kind). By default every known kind (the CPU).
    fn supports(&self, op: &list::OpRecord, _lens: [usize; 4]) -> bool {
        plugin::OpKind::from_code(op.kind).is_some()
    }

    /// Runs a list of ops in order — a whole stage, so a device backend can submit it at once, keep its
    /// intermediate results (tensors with no host flag) to itself, and replay what it recorded for a list of
    /// the same structure. Each op's weight is a `*const Weight` this backend made. A host backend allocates the
    /// list's intermediate results for the call. Tensors are named by index (and resident ones by id), never by
    /// address: host memory is only where a tensor's host flags say values cross.
    ///
    /// # Safety
    /// The list must be well formed ([`list::List::check`]); every tensor with a host flag must have host memory
    /// valid for its `capacity` for the call, used by nothing else meanwhile, and distinct tensors' memory must
    /// not overlap; every weight must be a live `Weight` this backend made.
    unsafe fn run_list(&self, list: list::List<'_>) -> Result<(), String>;

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

    /// [`Backend::upload`] of a `Linear` weight, for tests and tools (backends implement `upload`, not this; the
    /// engine's model code uploads through its own `linear::upload`, which returns the error): a refused weight
    /// panics.
    fn upload_linear(
        &self,
        w: &[f32],
        out: usize,
        inp: usize,
        bias: Option<&[f32]>,
        format: WeightFormat,
    ) -> Weight {
        let data = WeightData::Linear {
            w,
            out,
            inp,
            bias,
            format,
        };
        uploaded(self.name(), self.upload(data))
    }

    /// [`Backend::upload`] of a `Conv1d` weight (as [`Backend::upload_linear`]).
    fn upload_conv1d(
        &self,
        w: &[f32],
        cout: usize,
        cin: usize,
        k: usize,
        bias: Option<&[f32]>,
    ) -> Weight {
        let data = WeightData::Conv1d {
            w,
            cout,
            cin,
            k,
            bias,
            format: WeightFormat::F32,
        };
        uploaded(self.name(), self.upload(data))
    }

    /// [`Backend::upload`] of a depthwise `Conv1d` weight (as [`Backend::upload_linear`]).
    fn upload_depthwise_conv1d(
        &self,
        w: &[f32],
        channels: usize,
        k: usize,
        bias: Option<&[f32]>,
    ) -> Weight {
        let data = WeightData::DepthwiseConv1d {
            w,
            channels,
            k,
            bias,
        };
        uploaded(self.name(), self.upload(data))
    }

    /// [`Backend::upload`] of a `ConvTranspose1d` weight (as [`Backend::upload_linear`]).
    fn upload_conv_transpose1d(
        &self,
        w: &[f32],
        cin: usize,
        cout: usize,
        k: usize,
        stride: usize,
    ) -> Weight {
        let data = WeightData::ConvTranspose1d {
            w,
            cin,
            cout,
            k,
            stride,
            format: WeightFormat::F32,
        };
        uploaded(self.name(), self.upload(data))
    }
}

fn uploaded(backend: &str, weight: Result<Weight, String>) -> Weight {
    weight.unwrap_or_else(|e| panic!("backend `{backend}` refused a weight: {e}"))
}
