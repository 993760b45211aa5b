//! One case: its op, shape and weight format; its deterministic inputs; the list that runs it on a backend; and
//! its expected result, from the CPU backend.

use std::sync::OnceLock;

use kazeia_backend_abi::list::HostList;
use kazeia_backend_abi::plugin::{attention_n, strided_n, OpKind};
use kazeia_backend_abi::{
    AttentionSpan, Backend, Heads, Strided, Weight, WeightData, WeightFormat,
};
use kazeia_backend_cpu::CpuBackend;

/// An op's operand sizes (and the parameters that shape its inputs).
#[derive(Clone, Copy, Debug)]
pub enum Shape {
    /// `x[rows][inp]` → `y[rows][out]`, with or without a bias.
    Linear {
        out: usize,
        inp: usize,
        rows: usize,
        bias: bool,
    },
    Conv1d {
        cout: usize,
        cin: usize,
        k: usize,
        dilation: usize,
        len: usize,
    },
    DepthwiseConv1d {
        channels: usize,
        k: usize,
        len: usize,
    },
    ConvTranspose1d {
        cin: usize,
        cout: usize,
        k: usize,
        stride: usize,
        len: usize,
    },
    /// `rows` rows of `dim` (RmsNorm, LayerNorm).
    Norm {
        rows: usize,
        dim: usize,
        eps: f32,
    },
    Rope {
        rows: usize,
        heads: usize,
        head_dim: usize,
        start_pos: usize,
        theta: f32,
    },
    Attention {
        heads: Heads,
        span: AttentionSpan,
    },
    /// `alpha = exp(u · log_alpha)` for `u` in [-1, 1), inputs in ±`scale`.
    SnakeBeta {
        channels: usize,
        len: usize,
        log_alpha: f32,
        scale: f32,
    },
    /// `len` values in ±`scale` (Gelu, Silu, SiluMul).
    Elementwise {
        len: usize,
        scale: f32,
    },
    /// A view of a `src_len` source into a `dst_len` destination (Copy, Add, Mul).
    Strided {
        shape: Strided,
        src_len: usize,
        dst_len: usize,
    },
}

/// One op to check: kind, weight format (for the weighted kinds), shape, and a note saying what it stands for.
#[derive(Clone, Debug)]
pub struct Case {
    pub kind: OpKind,
    pub format: Option<WeightFormat>,
    pub shape: Shape,
    pub note: String,
}

/// A case's inputs: the weight and bias (weighted ops), the operands `a`, `b`, `c` (empty: absent) and the
/// output's values before the op (NaN where the op writes it whole, so a value it misses shows).
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
    pub a: Vec<f32>,
    pub b: Vec<f32>,
    pub c: Vec<f32>,
    pub out: Vec<f32>,
}

/// Deterministic values in [-scale, scale) (xorshift).
pub fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// `v` rounded to the nearest f16 and back (round to nearest even; the values here are normal halves).
fn round_f16(v: f32) -> f32 {
    let bits = v.to_bits();
    // Keep 10 of the 23 mantissa bits, rounding to nearest even.
    let lower = bits & 0x1fff;
    let mut kept = bits & !0x1fff;
    if lower > 0x1000 || (lower == 0x1000 && kept & 0x2000 != 0) {
        kept += 0x2000;
    }
    f32::from_bits(kept)
}

/// The built-in CPU backend the references come from (one thread: the same sums on every machine size).
pub fn cpu() -> &'static CpuBackend {
    static CPU: OnceLock<CpuBackend> = OnceLock::new();
    CPU.get_or_init(|| CpuBackend::new(1).with_direct_convolutions())
}

impl Case {
    pub fn new(kind: OpKind, format: Option<WeightFormat>, shape: Shape, note: &str) -> Case {
        Case {
            kind,
            format,
            shape,
            note: note.to_string(),
        }
    }

    /// What the case is, in one line: kind, format, sizes, note.
    pub fn name(&self) -> String {
        let format = self.format.map_or(String::new(), |f| format!(" {f}"));
        let sizes = match self.shape {
            Shape::Linear {
                out,
                inp,
                rows,
                bias,
            } => format!(
                "{inp}→{out}, {rows} rows{}",
                if bias { "" } else { ", no bias" }
            ),
            Shape::Conv1d {
                cout,
                cin,
                k,
                dilation,
                len,
            } => format!("{cin}→{cout} k{k} d{dilation} len {len}"),
            Shape::DepthwiseConv1d { channels, k, len } => format!("{channels} k{k} len {len}"),
            Shape::ConvTranspose1d {
                cin,
                cout,
                k,
                stride,
                len,
            } => format!("{cin}→{cout} k{k} s{stride} len {len}"),
            Shape::Norm { rows, dim, .. } => format!("{rows}×{dim}"),
            Shape::Rope {
                rows,
                heads,
                head_dim,
                start_pos,
                ..
            } => format!("{rows} rows of {heads}×{head_dim} at {start_pos}"),
            Shape::Attention { heads, span } => format!(
                "heads {}/{}×{}, {} queries at {}, {} keys at {}{}",
                heads.q_heads,
                heads.kv_heads,
                heads.head_dim,
                span.queries,
                span.query_start,
                span.keys,
                span.key_start,
                span.window
                    .map_or(String::new(), |w| format!(", window {w}"))
            ),
            Shape::SnakeBeta { channels, len, .. } => format!("{channels}×{len}"),
            Shape::Elementwise { len, .. } => format!("{len}"),
            Shape::Strided { shape, .. } => format!("{}×{}", shape.rows, shape.cols),
        };
        let note = if self.note.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.note)
        };
        format!("{:?}{format} {sizes}{note}", self.kind)
    }

    /// A convolution's `n` weights in ±0.3 from `seed`: halves for an f16 case, since a backend may hold an f16
    /// convolution at half precision or in f32 (`WeightData::Conv1d`), and weights that are halves make both
    /// the same.
    fn conv_weights(&self, n: usize, seed: u64) -> Vec<f32> {
        let mut weight = values(n, seed, 0.3);
        if self.format == Some(WeightFormat::F16) {
            weight.iter_mut().for_each(|v| *v = round_f16(*v));
        }
        weight
    }

    /// The case's inputs, the same on every run and machine (seeds from the sizes, so cases differ).
    pub fn inputs(&self) -> Inputs {
        let seed = |i: u64| {
            let name = self.name();
            name.bytes()
                .fold(i.wrapping_add(0xcbf2_9ce4_8422_2325), |h, b| {
                    (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
                })
        };
        let nan = |n: usize| vec![f32::NAN; n];
        match self.shape {
            Shape::Linear {
                out,
                inp,
                rows,
                bias,
            } => Inputs {
                weight: values(out * inp, seed(1), 0.1),
                bias: bias.then(|| values(out, seed(2), 0.5)),
                a: values(rows * inp, seed(3), 1.0),
                out: nan(rows * out),
                ..Inputs::default()
            },
            Shape::Conv1d {
                cout,
                cin,
                k,
                dilation,
                len,
            } => Inputs {
                weight: self.conv_weights(cout * cin * k, seed(1)),
                bias: Some(values(cout, seed(2), 0.3)),
                a: values(cin * len, seed(3), 1.0),
                out: nan(cout * (len - (k - 1) * dilation)),
                ..Inputs::default()
            },
            Shape::DepthwiseConv1d { channels, k, len } => Inputs {
                weight: values(channels * k, seed(1), 0.3),
                bias: Some(values(channels, seed(2), 0.3)),
                a: values(channels * len, seed(3), 1.0),
                out: nan(channels * (len + 1 - k)),
                ..Inputs::default()
            },
            Shape::ConvTranspose1d {
                cin,
                cout,
                k,
                stride,
                len,
            } => Inputs {
                weight: self.conv_weights(cin * cout * k, seed(1)),
                a: values(cin * len, seed(3), 1.0),
                out: nan(cout * ((len - 1) * stride + k)),
                ..Inputs::default()
            },
            Shape::Norm { rows, dim, .. } => Inputs {
                a: values(dim, seed(1), 1.0),
                b: if self.kind == OpKind::LayerNorm {
                    values(dim, seed(2), 1.0)
                } else {
                    Vec::new()
                },
                out: values(rows * dim, seed(3), 4.0),
                ..Inputs::default()
            },
            Shape::Rope {
                rows,
                heads,
                head_dim,
                ..
            } => Inputs {
                out: values(rows * heads * head_dim, seed(1), 2.0),
                ..Inputs::default()
            },
            Shape::Attention { heads, span } => {
                let d = heads.head_dim;
                Inputs {
                    a: values(span.queries * heads.q_heads * d, seed(1), 1.0),
                    b: values(span.keys * heads.kv_heads * d, seed(2), 1.0),
                    c: values(span.keys * heads.kv_heads * d, seed(3), 1.0),
                    out: nan(span.queries * heads.q_heads * d),
                    ..Inputs::default()
                }
            }
            Shape::SnakeBeta {
                channels,
                len,
                log_alpha,
                scale,
            } => Inputs {
                a: values(channels, seed(1), log_alpha)
                    .iter()
                    .map(|v| v.exp())
                    .collect(),
                b: values(channels, seed(2), 1.0)
                    .iter()
                    .map(|v| 1.0 / (v.exp() + 1e-9))
                    .collect(),
                out: values(channels * len, seed(3), scale),
                ..Inputs::default()
            },
            Shape::Elementwise { len, scale } => Inputs {
                a: if self.kind == OpKind::SiluMul {
                    values(len, seed(1), 2.0)
                } else {
                    Vec::new()
                },
                out: values(len, seed(2), scale),
                ..Inputs::default()
            },
            Shape::Strided {
                src_len, dst_len, ..
            } => Inputs {
                a: values(src_len, seed(1), 4.0),
                out: values(dst_len, seed(2), 2.0),
                ..Inputs::default()
            },
        }
    }

    /// The weight to upload (`None` for a weightless op), in PyTorch's layout and the case's format.
    pub fn weight_data<'a>(&self, inputs: &'a Inputs) -> Option<WeightData<'a>> {
        let w = &inputs.weight;
        let bias = inputs.bias.as_deref();
        let format = self.format.unwrap_or_default();
        Some(match self.shape {
            Shape::Linear { out, inp, .. } => WeightData::Linear {
                w,
                out,
                inp,
                bias,
                format,
            },
            Shape::Conv1d { cout, cin, k, .. } => WeightData::Conv1d {
                w,
                cout,
                cin,
                k,
                bias,
                format,
            },
            Shape::DepthwiseConv1d { channels, k, .. } => WeightData::DepthwiseConv1d {
                w,
                channels,
                k,
                bias,
            },
            Shape::ConvTranspose1d {
                cin,
                cout,
                k,
                stride,
                ..
            } => WeightData::ConvTranspose1d {
                w,
                cin,
                cout,
                k,
                stride,
                format,
            },
            _ => return None,
        })
    }

    /// The op's `n` and `f[0]`.
    pub fn parameters(&self) -> ([u64; 8], f32) {
        let n = |v: &[usize]| kazeia_backend_abi::list::sizes(v);
        match self.shape {
            Shape::Linear { rows, .. } => (n(&[rows]), 0.0),
            Shape::Conv1d { dilation, len, .. } => (n(&[len, dilation]), 0.0),
            Shape::DepthwiseConv1d { len, .. } | Shape::ConvTranspose1d { len, .. } => {
                (n(&[len]), 0.0)
            }
            Shape::Norm { dim, eps, .. } => (n(&[dim]), eps),
            Shape::Rope {
                heads,
                head_dim,
                start_pos,
                theta,
                ..
            } => (n(&[heads, head_dim, start_pos]), theta),
            Shape::Attention { heads, span } => (
                attention_n(heads, span),
                1.0 / (heads.head_dim as f32).sqrt(),
            ),
            Shape::SnakeBeta { len, .. } => (n(&[len]), 0.0),
            Shape::Elementwise { .. } => ([0; 8], 0.0),
            Shape::Strided { shape, .. } => (strided_n(shape), 0.0),
        }
    }

    /// The one-op list of the case over `inputs`' operands and `out` (which starts as `inputs.out`), on `weight`
    /// (a handle of the backend that runs the list).
    pub fn list<'a>(
        &self,
        inputs: &'a Inputs,
        weight: Option<&'a Weight>,
        out: &'a mut [f32],
    ) -> HostList<'a> {
        let mut l = HostList::new();
        let mut operand = |v: &'a [f32]| (!v.is_empty()).then(|| l.input(v));
        let ops = [operand(&inputs.a), operand(&inputs.b), operand(&inputs.c)];
        // An op that reads its output (in place, strided) gets its starting values; the others write it whole.
        let o = if self.kind.reads_output() {
            l.in_out(out)
        } else {
            l.output(out)
        };
        let (n, f) = self.parameters();
        l.op(self.kind, weight, ops, o, n, f);
        l
    }

    /// The values a linear weight holds in the case's format, `[out][inp]`: as the CPU backend rounds or
    /// quantises them (its export, decoded). For the other ops, the weights as given.
    pub fn held_weight(&self, inputs: &Inputs) -> Vec<f32> {
        let (Shape::Linear { out, inp, .. }, Some(format)) = (self.shape, self.format) else {
            return inputs.weight.clone();
        };
        if format == WeightFormat::F32 {
            return inputs.weight.clone();
        }
        let w = cpu().upload_linear(&inputs.weight, out, inp, None, format);
        let bytes = cpu()
            .export_linear(&w)
            .expect("the CPU exports linear weights");
        decode_export(&bytes, out, inp, format)
    }

    /// The expected result: the CPU backend's, on the weight values the format holds ([`Case::held_weight`]),
    /// computed in f32 (so a quantised format's reference multiplies f32 activations).
    pub fn reference(&self, inputs: &Inputs) -> Vec<f32> {
        let cpu = cpu();
        let mut y = inputs.out.clone();
        let a = &inputs.a;
        match self.shape {
            Shape::Linear { out, inp, rows, .. } => {
                let held = self.held_weight(inputs);
                let bias = inputs.bias.as_deref();
                let w = cpu.upload_linear(&held, out, inp, bias, WeightFormat::F32);
                cpu.linear(&w, a, rows, &mut y);
            }
            Shape::Conv1d {
                cout,
                cin,
                k,
                dilation,
                len,
            } => {
                let bias = inputs.bias.as_deref();
                let w = cpu.upload_conv1d(&inputs.weight, cout, cin, k, bias);
                cpu.conv1d(&w, a, len, dilation, &mut y);
            }
            Shape::DepthwiseConv1d { channels, k, len } => {
                let bias = inputs.bias.as_deref();
                let w = cpu.upload_depthwise_conv1d(&inputs.weight, channels, k, bias);
                cpu.depthwise_conv1d(&w, a, len, &mut y);
            }
            Shape::ConvTranspose1d {
                cin,
                cout,
                k,
                stride,
                len,
            } => {
                let w = cpu.upload_conv_transpose1d(&inputs.weight, cin, cout, k, stride);
                cpu.conv_transpose1d(&w, a, len, &mut y);
            }
            Shape::Norm { dim, eps, .. } if self.kind == OpKind::RmsNorm => {
                cpu.rms_norm(&mut y, dim, a, eps)
            }
            Shape::Norm { dim, eps, .. } => cpu.layer_norm(&mut y, dim, a, &inputs.b, eps),
            Shape::Rope {
                heads,
                head_dim,
                start_pos,
                theta,
                ..
            } => cpu.rope(&mut y, heads, head_dim, start_pos, theta),
            Shape::Attention { heads, span } => {
                let (_, scale) = self.parameters();
                cpu.attention(a, &inputs.b, &inputs.c, heads, span, scale, &mut y);
            }
            Shape::SnakeBeta { len, .. } => cpu.snake_beta(&mut y, len, a, &inputs.b),
            Shape::Elementwise { .. } => match self.kind {
                OpKind::Gelu => cpu.gelu(&mut y),
                OpKind::Silu => cpu.silu(&mut y),
                _ => cpu.silu_mul(&mut y, a),
            },
            Shape::Strided { shape, .. } => {
                let combine = self.kind.combine().expect("a strided kind");
                cpu.strided(combine, a, &mut y, shape);
            }
        }
        y
    }

    /// The tolerance of the case's result (`tolerance::of` its kind; a quantised linear layer on a backend
    /// that multiplies int8 activations: [`crate::tolerance::INT8_ACTIVATIONS`]).
    pub fn tolerance(&self, int8_activations: bool) -> f32 {
        let quantised = matches!(self.format, Some(WeightFormat::Q8_0 | WeightFormat::Q4_0));
        if self.kind == OpKind::Linear && quantised && int8_activations {
            crate::tolerance::INT8_ACTIVATIONS
        } else {
            crate::tolerance::of(self.kind)
        }
    }

    /// Runs the case on `backend` with the weight from `upload` (a backend's own `upload`, or a self-test's
    /// choice of kernel): `Refused` when the upload or `supports` refuses it, else the run's result and the
    /// output (an error value when the list fails).
    pub fn run_on(
        &self,
        backend: &dyn Backend,
        inputs: &Inputs,
        upload: &dyn Fn(WeightData<'_>) -> Result<Weight, String>,
    ) -> Run {
        let weight = match self.weight_data(inputs).map(upload).transpose() {
            Ok(w) => w,
            Err(e) => return Run::Refused(format!("upload refused: {e}")),
        };
        let mut out = inputs.out.clone();
        let l = self.list(inputs, weight.as_ref(), &mut out);
        let list = l.list();
        if let Err(e) = list.check() {
            return Run::Failed(format!("the suite built a bad list: {e}"));
        }
        if !backend.supports(&list.ops[0], list.lens(&list.ops[0])) {
            return Run::Refused("`supports` says no".into());
        }
        // SAFETY: the list's tensors are `inputs`' and `out`'s live slices, disjoint, for the call; its weight is
        // one `backend`'s upload made (or the caller's, for `backend`).
        let ran = unsafe { backend.run_list(list) };
        drop(l);
        match ran {
            Ok(()) => Run::Ran(out),
            Err(e) => Run::Failed(e),
        }
    }

    /// Runs the case on `backend`, refused or not, as the engine's fallback would: the list goes to
    /// `run_list` whatever `supports` said (the upload must take the weight).
    pub fn run_anyway(&self, backend: &dyn Backend, inputs: &Inputs) -> Result<Vec<f32>, String> {
        let weight = self
            .weight_data(inputs)
            .map(|d| backend.upload(d))
            .transpose()?;
        let mut out = inputs.out.clone();
        let l = self.list(inputs, weight.as_ref(), &mut out);
        // SAFETY: as in `run_on`.
        let ran = unsafe { backend.run_list(l.list()) };
        drop(l);
        ran.map(|()| out)
    }
}

/// What running a case on a backend gave.
#[derive(Debug)]
pub enum Run {
    /// Refused, and why (the upload, or `supports`).
    Refused(String),
    /// `run_list` returned this error.
    Failed(String),
    /// The output.
    Ran(Vec<f32>),
}

/// `[out][inp]` values of a linear weight from `export_linear` bytes (the CPU backend's and Vulkan's format: a
/// 33-byte header, then `[out][padded]` values: f32, f16 or bf16, or Q8_0/Q4_0 scales (f32) and then quants).
pub fn decode_export(bytes: &[u8], out: usize, inp: usize, format: WeightFormat) -> Vec<f32> {
    let padded = inp.div_ceil(32) * 32;
    let body = &bytes[33..];
    let n = out * padded;
    let f32_at = |i: usize| f32::from_le_bytes(body[4 * i..4 * i + 4].try_into().unwrap());
    let u16_at = |i: usize| u16::from_le_bytes([body[2 * i], body[2 * i + 1]]);
    let value = |i: usize| -> f32 {
        match format {
            WeightFormat::F32 => f32_at(i),
            WeightFormat::F16 => f16_to_f32(u16_at(i)),
            WeightFormat::BF16 => f32::from_bits((u16_at(i) as u32) << 16),
            WeightFormat::Q8_0 => body[n / 32 * 4 + i] as i8 as f32 * f32_at(i / 32),
            WeightFormat::Q4_0 => {
                let (block, e) = (i / 32, i % 32);
                let byte = body[n / 32 * 4 + block * 16 + e % 16];
                let q = if e < 16 { byte & 15 } else { byte >> 4 };
                (q as i32 - 8) as f32 * f32_at(block)
            }
        }
    };
    (0..out)
        .flat_map(|o| (0..inp).map(move |i| o * padded + i))
        .map(value)
        .collect()
}

/// An IEEE half's value.
fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let frac = (h & 0x3ff) as f32;
    sign * match exp {
        0 => frac * 2f32.powi(-24),
        31 if frac == 0.0 => f32::INFINITY,
        31 => f32::NAN,
        e => (1.0 + frac / 1024.0) * 2f32.powi(e - 15),
    }
}
