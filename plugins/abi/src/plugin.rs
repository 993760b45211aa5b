//! The C ABI between Kazeia and a backend plugin (`dlopen`ed shared library).
//!
//! A plugin exports one symbol, [`ENTRY_SYMBOL`], returning a pointer to a static [`PluginApi`] table that
//! starts with a magic, the ABI version and the table's size, so a loader can refuse a mismatched plugin before
//! calling anything else. Everything else crosses as plain C data: opaque handles for backends and uploaded
//! weights, op lists ([`OpList`]: [`OpRecord`]s naming their operands by index into a table of
//! [`TensorRecord`]s, see [`crate::list`]), and an [`ErrorBuffer`] for messages. A whole stage is one list
//! ([`PluginApi::run_list`]), so a device backend can submit it at once; a plugin says what it is
//! ([`PluginApi::capabilities`], [`PluginApi::device_info`]) and per op, with its sizes, whether it takes it
//! ([`PluginApi::supports`]); the engine runs the rest on its own CPU backend.
//! Plugins catch their panics at this boundary and are never unloaded.

use std::ffi::{c_char, c_void};

pub use crate::list::{OpList, OpRecord, TensorRecord, NO_TENSOR};
use crate::records::input;
use crate::{AttentionSpan, Capabilities, Combine, Heads, Strided, View, WeightData, WeightFormat};

/// `"KZBP"`.
pub const PLUGIN_MAGIC: u32 = 0x4b5a_4250;
/// Bumped on any incompatible change of the structures below, together with [`ENTRY_SYMBOL`]'s version (so a
/// plugin of another version is told apart before its table is read). 2: typed [`crate::Capabilities`] instead
/// of capability codes in `supports_op`. 3: `supports` sees the whole record (shapes, formats, weight), not only
/// its kind. 4: op lists over a tensor table (operands by index, intermediates without host memory, resident
/// and zeroed tensors as tensor attributes instead of hint ops), `device_info`.
pub const PLUGIN_ABI_VERSION: u32 = 4;
/// The one symbol a plugin exports: `extern "C" fn() -> *const PluginApi`. Define it with [`crate::plugin_entry!`].
pub const ENTRY_SYMBOL: &[u8] = b"kazeia_backend_plugin_v4\0";

/// The entry symbol of ABI version `version` (to name the version of a plugin built for another one).
pub fn entry_symbol(version: u32) -> String {
    format!("kazeia_backend_plugin_v{version}")
}

/// Defines the plugin's entry symbol ([`ENTRY_SYMBOL`]) returning `$table` (a `&'static PluginApi`); one
/// crate of a plugin's binary uses it once.
#[macro_export]
macro_rules! plugin_entry {
    ($table:expr) => {
        /// The plugin's entry symbol (`kazeia_backend_abi::plugin::ENTRY_SYMBOL`).
        #[no_mangle]
        pub extern "C" fn kazeia_backend_plugin_v4() -> *const $crate::plugin::PluginApi {
            $table
        }
    };
}

pub type EntryFn = unsafe extern "C" fn() -> *const PluginApi;

/// A message from the plugin, NUL-terminated, truncated to fit.
#[repr(C)]
pub struct ErrorBuffer {
    pub message: [u8; 256],
}

impl Default for ErrorBuffer {
    fn default() -> Self {
        ErrorBuffer { message: [0; 256] }
    }
}

impl ErrorBuffer {
    pub fn set(&mut self, text: &str) {
        let n = text.len().min(self.message.len() - 1);
        self.message[..n].copy_from_slice(&text.as_bytes()[..n]);
        self.message[n] = 0;
    }

    pub fn text(&self) -> String {
        let end = self
            .message
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.message.len());
        String::from_utf8_lossy(&self.message[..end]).into_owned()
    }
}

/// Kinds of weights a plugin uploads (and repacks as it likes).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightKind {
    /// `dims = [out, in]`, `format` = [`crate::WeightFormat`] as `u32`.
    Linear = 1,
    /// `dims = [cout, cin, k]`, `format` F32 or F16 (a plugin may hold an F16 one in f32).
    Conv1d = 2,
    /// `dims = [channels, k]`.
    DepthwiseConv1d = 3,
    /// `dims = [cin, cout, k, stride]`, `format` as for `Conv1d`.
    ConvTranspose1d = 4,
}

/// What to upload: `data` holds the weight in PyTorch's layout, `bias` (may be null) its bias.
#[repr(C)]
pub struct WeightDesc {
    pub kind: u32,
    pub format: u32,
    pub dims: [u64; 4],
    pub data: *const f32,
    pub data_len: usize,
    pub bias: *const f32,
    pub bias_len: usize,
}

impl WeightData<'_> {
    /// The weight as the C table describes it, valid while `self`'s slices are borrowed.
    pub fn desc(&self) -> WeightDesc {
        let (kind, format, data, bias) = match *self {
            WeightData::Linear {
                w, bias, format, ..
            } => (WeightKind::Linear, format, w, bias),
            WeightData::Conv1d {
                w, bias, format, ..
            } => (WeightKind::Conv1d, format, w, bias),
            WeightData::DepthwiseConv1d { w, bias, .. } => {
                (WeightKind::DepthwiseConv1d, WeightFormat::F32, w, bias)
            }
            WeightData::ConvTranspose1d { w, format, .. } => {
                (WeightKind::ConvTranspose1d, format, w, None)
            }
        };
        WeightDesc {
            kind: kind as u32,
            format: format.code(),
            dims: self.dims().map(|d| d as u64),
            data: data.as_ptr(),
            data_len: data.len(),
            bias: bias.map_or(std::ptr::null(), <[f32]>::as_ptr),
            bias_len: bias.map_or(0, <[f32]>::len),
        }
    }
}

impl WeightDesc {
    /// The weight this describes, checked ([`WeightData::check`]).
    ///
    /// # Safety
    /// `data` and `bias` (when not null) must be valid for their lengths for `'a`.
    pub unsafe fn data<'a>(&self) -> Result<WeightData<'a>, String> {
        // SAFETY: valid for their lengths for `'a` (this function's contract).
        let w = unsafe { input(self.data, self.data_len)? };
        let bias = if self.bias.is_null() {
            None
        } else {
            // SAFETY: as `w`.
            Some(unsafe { input(self.bias, self.bias_len)? })
        };
        let n = self.dims.map(|v| usize::try_from(v).unwrap_or(usize::MAX));
        let format = || {
            WeightFormat::from_code(self.format)
                .ok_or_else(|| format!("unknown weight format {}", self.format))
        };
        let data = match self.kind {
            k if k == WeightKind::Linear as u32 => WeightData::Linear {
                w,
                out: n[0],
                inp: n[1],
                bias,
                format: format()?,
            },
            k if k == WeightKind::Conv1d as u32 => WeightData::Conv1d {
                w,
                cout: n[0],
                cin: n[1],
                k: n[2],
                bias,
                format: format()?,
            },
            k if k == WeightKind::DepthwiseConv1d as u32 => WeightData::DepthwiseConv1d {
                w,
                channels: n[0],
                k: n[1],
                bias,
            },
            k if k == WeightKind::ConvTranspose1d as u32 => WeightData::ConvTranspose1d {
                w,
                cin: n[0],
                cout: n[1],
                k: n[2],
                stride: n[3],
                format: format()?,
            },
            other => return Err(format!("unknown weight kind {other}")),
        };
        data.check()?;
        Ok(data)
    }
}

/// Op kinds: what each computes, and the meaning of an [`OpRecord`]'s fields for it. `a`, `b`, `c` are the
/// record's inputs and `out` its output, tensors of the list; an op reads and writes whole tensors (offsets and
/// strides are its parameters). Sequences are row-major `x[rows][features]`, signals channel-major
/// `x[channels][len]` (the crate's conventions); `kazeia-backend-cpu` is the reference implementation of each.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// `y[rows][out] = x[rows][in] · wᵀ + bias`: weight, a = x, out = y (written whole), `n[0]` = rows.
    Linear = 1,
    /// Valid (unpadded) dilated convolution, `x[cin][len]` → `y[cout][len - (k-1)·dilation]`, bias added (callers
    /// pad on the left or pass the previous chunk's tail): weight, a = x, out = y (written whole), `n[0]` = len,
    /// `n[1]` = dilation.
    Conv1d = 2,
    /// Valid depthwise convolution, dilation 1, `x[c][len]` → `y[c][len - (k-1)]`, bias added: weight, a = x,
    /// out = y (written whole), `n[0]` = len.
    DepthwiseConv1d = 3,
    /// Full transposed convolution without bias, `x[cin][len]` → `y[cout][(len-1)·stride + k]` (written whole;
    /// the overlapping tail can be carried to the next chunk and summed): weight, a = x, out = y, `n[0]` = len.
    ConvTranspose1d = 4,
    /// RMSNorm of each `dim`-wide row, `x · rsqrt(mean(x²) + eps) · weight`: out = x (in place), a = weight,
    /// `n[0]` = dim, `f[0]` = eps.
    RmsNorm = 5,
    /// LayerNorm of each `dim`-wide row (biased variance) with affine weight and bias: out = x (in place),
    /// a = weight, b = bias, `n[0]` = dim, `f[0]` = eps.
    LayerNorm = 6,
    /// Rotary embedding, split-half ("NeoX") pairing, on `x[rows][heads][head_dim]`, row `r` at position
    /// `start_pos + r`: out = x (in place), n = [heads, head_dim, start_pos], `f[0]` = theta.
    Rope = 7,
    /// Causal softmax attention ([`Heads`], [`AttentionSpan`]) writing `out[queries][q_heads][head_dim]` (whole):
    /// a = q, b = k, c = v, out, n = [q_heads, kv_heads, head_dim, queries, query_start, keys, key_start, window
    /// (0 = none)], `f[0]` = scale.
    Attention = 8,
    /// SnakeBeta on `x[channels][len]`, `x + inv_beta[c] · sin(alpha[c] · x)²` (alpha exponentiated, beta inverted
    /// by the caller): out = x (in place), a = alpha, b = inv_beta, `n[0]` = len.
    SnakeBeta = 9,
    /// Exact (erf) GELU: out = x (in place).
    Gelu = 10,
    /// SiLU, `x · sigmoid(x)`: out = x (in place).
    Silu = 11,
    /// The SwiGLU product `gate = silu(gate) · up`: out = gate (in place), a = up.
    SiluMul = 12,
    /// `out[dst view] = a[src view]` ([`crate::Strided`]): n = [rows, cols, src offset, src row stride, src column
    /// stride, dst offset, dst row stride, dst column stride]; the rest of `out` keeps its values.
    Copy = 13,
    /// `out[dst view] += a[src view]`, n as for [`OpKind::Copy`].
    Add = 14,
    /// `out[dst view] *= a[src view]`, n as for [`OpKind::Copy`].
    Mul = 15,
}

impl OpKind {
    /// Every kind, in code order.
    pub const ALL: [OpKind; 15] = [
        OpKind::Linear,
        OpKind::Conv1d,
        OpKind::DepthwiseConv1d,
        OpKind::ConvTranspose1d,
        OpKind::RmsNorm,
        OpKind::LayerNorm,
        OpKind::Rope,
        OpKind::Attention,
        OpKind::SnakeBeta,
        OpKind::Gelu,
        OpKind::Silu,
        OpKind::SiluMul,
        OpKind::Copy,
        OpKind::Add,
        OpKind::Mul,
    ];

    pub fn from_code(code: u32) -> Option<OpKind> {
        OpKind::ALL.get((code as usize).checked_sub(1)?).copied()
    }

    /// Whether ops of this kind carry a weight handle.
    pub fn has_weight(self) -> bool {
        matches!(
            self,
            OpKind::Linear | OpKind::Conv1d | OpKind::DepthwiseConv1d | OpKind::ConvTranspose1d
        )
    }

    /// Whether an op of this kind reads its output's old values (in place), so a fresh output must hold zeros
    /// first. A strided op reads them unless it covers the whole output ([`Strided::covers_dst`]).
    pub fn reads_output(self) -> bool {
        !matches!(
            self,
            OpKind::Linear
                | OpKind::Conv1d
                | OpKind::DepthwiseConv1d
                | OpKind::ConvTranspose1d
                | OpKind::Attention
        )
    }

    /// The strided combination of a [`OpKind::Copy`]/[`OpKind::Add`]/[`OpKind::Mul`] op (inverse of
    /// `OpKind::from(Combine)`).
    pub fn combine(self) -> Option<Combine> {
        match self {
            OpKind::Copy => Some(Combine::Copy),
            OpKind::Add => Some(Combine::Add),
            OpKind::Mul => Some(Combine::Mul),
            _ => None,
        }
    }
}

impl From<Combine> for OpKind {
    fn from(c: Combine) -> OpKind {
        match c {
            Combine::Copy => OpKind::Copy,
            Combine::Add => OpKind::Add,
            Combine::Mul => OpKind::Mul,
        }
    }
}

/// `n` of a strided op ([`OpKind::Copy`]).
pub fn strided_n(shape: Strided) -> [u64; 8] {
    [
        shape.rows,
        shape.cols,
        shape.src.offset,
        shape.src.row_stride,
        shape.src.col_stride,
        shape.dst.offset,
        shape.dst.row_stride,
        shape.dst.col_stride,
    ]
    .map(|v| v as u64)
}

/// A strided op's shape from its `n` (inverse of [`strided_n`]; `None` when a value does not fit a `usize`).
pub fn strided_of(n: [u64; 8]) -> Option<Strided> {
    let n: Vec<usize> = n
        .iter()
        .map(|&v| usize::try_from(v).ok())
        .collect::<Option<_>>()?;
    Some(Strided {
        rows: n[0],
        cols: n[1],
        src: View {
            offset: n[2],
            row_stride: n[3],
            col_stride: n[4],
        },
        dst: View {
            offset: n[5],
            row_stride: n[6],
            col_stride: n[7],
        },
    })
}

/// `n` of an [`OpKind::Attention`] op.
pub fn attention_n(heads: Heads, span: AttentionSpan) -> [u64; 8] {
    [
        heads.q_heads,
        heads.kv_heads,
        heads.head_dim,
        span.queries,
        span.query_start,
        span.keys,
        span.key_start,
        span.window.unwrap_or(0),
    ]
    .map(|v| v as u64)
}

/// An [`OpKind::Attention`] op's heads and span from its `n` (inverse of [`attention_n`]).
pub fn attention_of(n: [u64; 8]) -> (Heads, AttentionSpan) {
    let n = n.map(|v| v as usize);
    (
        Heads {
            q_heads: n[0],
            kv_heads: n[1],
            head_dim: n[2],
        },
        AttentionSpan {
            queries: n[3],
            query_start: n[4],
            keys: n[5],
            key_start: n[6],
            window: (n[7] > 0).then_some(n[7]),
        },
    )
}

/// What kind of device a backend runs on.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Other = 0,
    Cpu = 1,
    Gpu = 2,
    /// A DSP or NPU beside the CPU (Hexagon).
    Accelerator = 3,
}

impl DeviceKind {
    pub fn from_code(code: u32) -> DeviceKind {
        match code {
            1 => DeviceKind::Cpu,
            2 => DeviceKind::Gpu,
            3 => DeviceKind::Accelerator,
            _ => DeviceKind::Other,
        }
    }
}

/// One device of a plugin ([`PluginApi::device_info`]).
#[repr(C)]
pub struct DeviceInfo {
    /// NUL-terminated, truncated to fit.
    pub name: [u8; 256],
    /// [`DeviceKind`] as `u32`.
    pub kind: u32,
    /// Memory the device can hold weights and tensors in, in bytes (0: unknown, or the host's).
    pub memory: u64,
}

impl Default for DeviceInfo {
    fn default() -> Self {
        DeviceInfo {
            name: [0; 256],
            kind: DeviceKind::Other as u32,
            memory: 0,
        }
    }
}

impl DeviceInfo {
    pub fn new(name: &str, kind: DeviceKind, memory: u64) -> Self {
        let mut info = DeviceInfo {
            kind: kind as u32,
            memory,
            ..DeviceInfo::default()
        };
        let n = name.len().min(info.name.len() - 1);
        info.name[..n].copy_from_slice(&name.as_bytes()[..n]);
        info
    }

    pub fn name(&self) -> String {
        let end = self
            .name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.name.len());
        String::from_utf8_lossy(&self.name[..end]).into_owned()
    }
}

/// The table a plugin's entry symbol returns. All function pointers are required; status results are 0 on
/// success and non-zero with a message in the [`ErrorBuffer`] on failure.
///
/// The caller's contract, which every entry relies on: a `backend` is a handle this table's `create` returned
/// and not yet destroyed; a `weight` is one its `upload` or `import_linear` returned for that backend and not
/// yet freed; `bytes` given to `free_bytes` are what `export_linear` returned, with their length; every other
/// pointer is null or valid for the call (for the length beside it, one value otherwise), and op lists follow
/// [`crate::Backend::run_list`]'s rules. In turn a plugin's entries may be called from any thread, also at
/// once for one backend (as [`crate::Backend`] is `Send + Sync`).
#[repr(C)]
pub struct PluginApi {
    pub magic: u32,
    pub abi_version: u32,
    /// `size_of::<PluginApi>()` as the plugin was built.
    pub struct_size: u32,
    /// Short name, NUL-terminated, e.g. `cpu-avx512`.
    pub name: *const c_char,
    /// How well this build suits the running machine: > 0 usable (higher is better), ≤ 0 unusable.
    pub score: unsafe extern "C" fn() -> i32,
    /// Why the plugin cannot run here (when `score() <= 0`) into `err`.
    pub unavailable_reason: unsafe extern "C" fn(err: *mut ErrorBuffer),
    pub device_count: unsafe extern "C" fn() -> u32,
    /// Describes device `index` into `info`; 0 on success.
    pub device_info: unsafe extern "C" fn(index: u32, info: *mut DeviceInfo) -> i32,
    /// A backend on device `device` with `threads` workers; null on failure.
    pub create:
        unsafe extern "C" fn(device: u32, threads: u32, err: *mut ErrorBuffer) -> *mut c_void,
    pub destroy: unsafe extern "C" fn(backend: *mut c_void),
    /// What the backend is beyond its ops, asked once after `create`.
    pub capabilities: unsafe extern "C" fn(backend: *mut c_void) -> Capabilities,
    /// Uploads a weight; null on failure.
    pub upload: unsafe extern "C" fn(
        backend: *mut c_void,
        desc: *const WeightDesc,
        err: *mut ErrorBuffer,
    ) -> *mut c_void,
    pub free_weight: unsafe extern "C" fn(backend: *mut c_void, weight: *mut c_void),
    /// Whether this backend runs the op `op` describes, its operands `lens` values long (`a`, `b`, `c`, output;
    /// [`crate::Backend::supports`]; false for a kind the plugin does not know). It reads the record's kind, `n`,
    /// `f` and weight, and whether its output index is [`NO_TENSOR`]: such a record asks about its kind alone
    /// (would the backend take ops of this kind at some sizes); other tensor indices mean nothing here.
    pub supports: unsafe extern "C" fn(
        backend: *mut c_void,
        op: *const OpRecord,
        lens: *const [u64; 4],
    ) -> bool,
    /// Runs a list ([`crate::Backend::run_list`]).
    pub run_list: unsafe extern "C" fn(
        backend: *mut c_void,
        list: *const OpList,
        err: *mut ErrorBuffer,
    ) -> i32,
    /// The resident bytes of a linear weight for the on-disk cache: 0 and `*bytes`/`*len` set (free them with
    /// `free_bytes`), or non-zero when the plugin does not cache.
    pub export_linear: unsafe extern "C" fn(
        backend: *mut c_void,
        weight: *mut c_void,
        bytes: *mut *mut u8,
        len: *mut usize,
    ) -> i32,
    pub free_bytes: unsafe extern "C" fn(bytes: *mut u8, len: usize),
    /// A linear weight back from exported bytes if they describe `[out][in]` in `format`; null otherwise.
    pub import_linear: unsafe extern "C" fn(
        backend: *mut c_void,
        bytes: *const u8,
        len: usize,
        out: u64,
        inp: u64,
        format: u32,
    ) -> *mut c_void,
}

// SAFETY: the table is immutable; its one pointer field, `name`, points at a string the plugin never changes or
// frees (plugins are never unloaded), so sharing it across threads reads only constant data.
unsafe impl Sync for PluginApi {}
// SAFETY: as for `Sync`: nothing in the table is tied to the thread that read it.
unsafe impl Send for PluginApi {}
