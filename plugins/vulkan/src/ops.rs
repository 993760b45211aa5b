//! Ops of an ABI list, checked against their weights and operand sizes, and turned into one shader dispatch each.

use kazeia_backend_abi::list::{List, OpRecord, NO_TENSOR};
use kazeia_backend_abi::plugin::{attention_of, strided_n, OpKind};
use kazeia_backend_abi::{AttentionSpan, Combine, Heads, Strided, Weight};

use crate::context::Limits;
use crate::pipelines::{Activation, GemmMode, Kernel, NormKind, PUSH_WORDS};
use crate::weights::{GpuWeight, Shape};

/// Rows up to which a linear layer runs the matrix-vector kernel (`MAX_ROWS` in `matvec.comp`).
pub const MATVEC_ROWS: usize = 8;
/// Largest head size the attention kernel takes (`WG · MAX_DIM_PER_INVOCATION` in `attention.comp`).
pub const MAX_HEAD_DIM: usize = 256;

/// What an op computes, with its sizes.
#[derive(Clone, Copy, Debug)]
pub enum Math {
    Linear {
        rows: usize,
    },
    Conv1d {
        len: usize,
        dilation: usize,
    },
    Depthwise {
        len: usize,
    },
    ConvTranspose {
        len: usize,
    },
    RmsNorm {
        dim: usize,
        eps: f32,
    },
    LayerNorm {
        dim: usize,
        eps: f32,
    },
    Rope {
        heads: usize,
        head_dim: usize,
        start_pos: usize,
        theta: f32,
    },
    Attention {
        heads: Heads,
        span: AttentionSpan,
        scale: f32,
    },
    SnakeBeta {
        len: usize,
    },
    Gelu,
    Silu,
    SiluMul,
    Strided {
        combine: Combine,
        shape: Strided,
    },
}

/// One checked op: what it computes, its weight, and its operands (`a`, `b`, `c`, output) as tensor indices of
/// its list ([`NO_TENSOR`] where absent) with their lengths.
pub struct Op<'a> {
    pub math: Math,
    pub weight: Option<&'a GpuWeight>,
    pub operands: [u32; 4],
    pub lens: [usize; 4],
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

impl Math {
    /// What a record computes, from its kind, `n` and `f` alone (no buffer or weight is read).
    pub fn of(r: &OpRecord) -> Result<Math, String> {
        let n = r.n.map(|v| v as usize);
        let kind = r.kind;
        Ok(match kind {
            k if k == OpKind::Linear as u32 => Math::Linear { rows: n[0] },
            k if k == OpKind::Conv1d as u32 => Math::Conv1d {
                len: n[0],
                dilation: n[1],
            },
            k if k == OpKind::DepthwiseConv1d as u32 => Math::Depthwise { len: n[0] },
            k if k == OpKind::ConvTranspose1d as u32 => Math::ConvTranspose { len: n[0] },
            k if k == OpKind::RmsNorm as u32 => Math::RmsNorm {
                dim: n[0],
                eps: r.f[0],
            },
            k if k == OpKind::LayerNorm as u32 => Math::LayerNorm {
                dim: n[0],
                eps: r.f[0],
            },
            k if k == OpKind::Rope as u32 => Math::Rope {
                heads: n[0],
                head_dim: n[1],
                start_pos: n[2],
                theta: r.f[0],
            },
            k if k == OpKind::Attention as u32 => {
                let (heads, span) = attention_of(r.n);
                Math::Attention {
                    heads,
                    span,
                    scale: r.f[0],
                }
            }
            k if k == OpKind::SnakeBeta as u32 => Math::SnakeBeta { len: n[0] },
            k if k == OpKind::Gelu as u32 => Math::Gelu,
            k if k == OpKind::Silu as u32 => Math::Silu,
            k if k == OpKind::SiluMul as u32 => Math::SiluMul,
            k => match OpKind::from_code(k).and_then(OpKind::combine) {
                Some(combine) => Math::Strided {
                    combine,
                    shape: r.strided_shape().ok_or("a strided op's sizes overflow")?,
                },
                None => return Err(format!("unknown op kind {k}")),
            },
        })
    }
}

/// Whether a weightless op fits its kernel's limits, from its sizes alone (what [`crate::VulkanBackend`]'s
/// `supports` answers, and what [`Op::encode`] checks first): every buffer within one binding and 32-bit
/// indices, attention heads of at most [`MAX_HEAD_DIM`] and within the workgroup counts, strided views with
/// 32-bit offsets. Weighted ops are judged by their weight's shape when encoded.
pub fn fits(math: &Math, lens: [usize; 4], limits: &Limits) -> bool {
    let small = |v: usize| u32::try_from(v).is_ok();
    if !lens
        .iter()
        .all(|&len| small(len) && (len as u64) * 4 <= limits.max_binding)
    {
        return false;
    }
    match *math {
        Math::Attention { heads, span, .. } => {
            heads.head_dim <= MAX_HEAD_DIM
                && heads.q_heads <= limits.max_groups[0] as usize
                && span.queries <= limits.max_groups[1] as usize
                && [
                    heads.kv_heads,
                    span.query_start,
                    span.keys,
                    span.key_start,
                    span.window.unwrap_or(0),
                ]
                .into_iter()
                .all(small)
        }
        Math::Strided { shape, .. } => {
            small(shape.len()) && strided_n(shape).iter().all(|&v| v <= u64::from(u32::MAX))
        }
        _ => true,
    }
}

impl<'a> Op<'a> {
    /// Reads and checks an op of `list`: every size must agree with the op and its weight, so no shader ever
    /// reads or writes outside its buffers.
    ///
    /// # Safety
    /// The op's weight must be null or a `Weight` that lives for `'a`.
    pub unsafe fn from_record(r: &OpRecord, list: &List<'_>) -> Result<Op<'a>, String> {
        // SAFETY: this function's contract.
        unsafe { Op::new(r, list.lens(r)) }
    }

    /// Reads and checks an op whose operands are `lens` values long.
    ///
    /// # Safety
    /// As [`Op::from_record`].
    pub unsafe fn new(r: &OpRecord, lens: [usize; 4]) -> Result<Op<'a>, String> {
        let math = Math::of(r)?;
        // SAFETY: null or a `Weight` that lives for 'a (this function's contract).
        let weight: Option<&'a Weight> = unsafe { (r.weight as *const Weight).as_ref() };
        let weight = match weight {
            None => None,
            Some(w) => Some(
                w.downcast::<GpuWeight>()
                    .ok_or("a weight the Vulkan backend did not make")?,
            ),
        };
        let op = Op {
            math,
            weight,
            operands: r.operands(),
            lens,
        };
        op.validate()?;
        Ok(op)
    }

    fn weight_shape(&self) -> Result<Shape, String> {
        Ok(self
            .weight
            .ok_or("the op needs a weight and has none")?
            .shape)
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.operands[3] == NO_TENSOR {
            return Err("an op without an output".into());
        }
        let [a, b, c, out] = self.lens;
        let sizes = || format!("inputs of {a}, {b}, {c} and an output of {out} values");
        match self.math {
            Math::Linear { rows } => {
                let Shape::Linear { out: o, inp, .. } = self.weight_shape()? else {
                    return Err("a linear op needs a linear weight".into());
                };
                check(a == rows * inp && out == rows * o, || {
                    format!("linear {inp}→{o} on {rows} rows: {}", sizes())
                })
            }
            Math::Conv1d { len, dilation } => {
                let Shape::Conv { cout, cin, k } = self.weight_shape()? else {
                    return Err("a conv1d op needs a conv1d weight".into());
                };
                let reach = (k - 1) * dilation;
                check(dilation >= 1 && len > reach, || {
                    format!("conv1d k={k} dilation {dilation} on only {len} columns")
                })?;
                check(a == cin * len && out == cout * (len - reach), || {
                    format!("conv1d {cin}→{cout} over {len} columns: {}", sizes())
                })
            }
            Math::Depthwise { len } => {
                let Shape::Depthwise { channels, k } = self.weight_shape()? else {
                    return Err("a depthwise op needs a depthwise weight".into());
                };
                check(
                    len >= k && a == channels * len && out == channels * (len + 1 - k),
                    || {
                        format!(
                            "depthwise conv of {channels} channels, k={k}, {len} columns: {}",
                            sizes()
                        )
                    },
                )
            }
            Math::ConvTranspose { len } => {
                let Shape::ConvTranspose {
                    cin,
                    cout,
                    k,
                    stride,
                    ..
                } = self.weight_shape()?
                else {
                    return Err("a transposed conv op needs a transposed conv weight".into());
                };
                check(
                    len >= 1 && a == cin * len && out == cout * ((len - 1) * stride + k),
                    || {
                        format!(
                            "transposed conv {cin}→{cout} over {len} columns: {}",
                            sizes()
                        )
                    },
                )
            }
            Math::RmsNorm { dim, .. } => check(dim > 0 && out % dim == 0 && a == dim, || {
                format!("rms_norm of width {dim}: {}", sizes())
            }),
            Math::LayerNorm { dim, .. } => {
                check(dim > 0 && out % dim == 0 && a == dim && b == dim, || {
                    format!("layer_norm of width {dim}: {}", sizes())
                })
            }
            Math::Rope {
                heads, head_dim, ..
            } => check(
                heads > 0 && head_dim > 0 && head_dim % 2 == 0 && out % (heads * head_dim) == 0,
                || format!("rope with {heads} heads of {head_dim}: {}", sizes()),
            ),
            Math::Attention { heads, span, .. } => {
                let Heads {
                    q_heads,
                    kv_heads,
                    head_dim,
                } = heads;
                check(
                    kv_heads > 0 && head_dim > 0 && q_heads % kv_heads == 0,
                    || format!("attention with {q_heads} query heads over {kv_heads} kv heads"),
                )?;
                let kv = span.keys * kv_heads * head_dim;
                check(
                    a == span.queries * q_heads * head_dim && b == kv && c == kv && out == a,
                    || format!("attention: {}", sizes()),
                )
            }
            Math::SnakeBeta { len } => check(
                len > 0 && out % len == 0 && a == out / len && b == a,
                || format!("snake_beta over {len} columns: {}", sizes()),
            ),
            Math::Gelu | Math::Silu => Ok(()),
            Math::SiluMul => check(a == out, || format!("silu_mul: {}", sizes())),
            Math::Strided { shape, .. } => shape.check(a, out),
        }
    }

    /// The op as one dispatch, or `None` when its sizes are past the device's limits.
    pub fn encode(&self, limits: &Limits) -> Option<Dispatch<'a>> {
        if self.weight.is_none() && !fits(&self.math, self.lens, limits) {
            return None;
        }
        let d = self.dispatch(self.weight)?;
        let fits = d
            .tensors
            .iter()
            .all(|t| (t.len as u64) * 4 <= limits.max_binding)
            && d.groups
                .iter()
                .zip(limits.max_groups)
                .all(|(&g, m)| g <= m as usize);
        fits.then_some(d)
    }

    fn dispatch(&self, w: Option<&'a GpuWeight>) -> Option<Dispatch<'a>> {
        let u = |v: usize| u32::try_from(v).ok();
        let mut d = Dispatch::new(w);
        let [a, b, c, o] = self.operands;
        let [a_len, b_len, c_len, out_len] = self.lens;
        match self.math {
            Math::Linear { rows } => {
                let w = w?;
                let Shape::Linear {
                    out,
                    inp,
                    padded,
                    has_bias,
                } = w.shape
                else {
                    return None;
                };
                d.bind_weight();
                let x = d.read(a, a_len);
                let y = d.write(o, out_len);
                d.bind(3, x).bind(4, y);
                if rows <= MATVEC_ROWS {
                    d.kernel = Kernel::Matvec(w.format);
                    d.push(&[u(out)?, u(inp)?, u(padded)?, u(rows)?, has_bias as u32]);
                    d.groups = grid(out);
                } else {
                    d.kernel = Kernel::Gemm(GemmMode::Linear, w.format);
                    d.push(&[u(out)?, u(rows)?, u(inp)?, u(padded)?, has_bias as u32]);
                    d.groups = [rows.div_ceil(64), out.div_ceil(64), 1];
                }
            }
            Math::Conv1d { len, dilation } => {
                let w = w?;
                let Shape::Conv { cout, cin, k } = w.shape else {
                    return None;
                };
                let lout = len - (k - 1) * dilation;
                d.kernel = Kernel::Gemm(GemmMode::Conv, w.format);
                d.bind_weight();
                let x = d.read(a, a_len);
                let y = d.write(o, out_len);
                d.bind(3, x).bind(4, y);
                d.push(&[
                    u(cout)?,
                    u(lout)?,
                    u(cin * k)?,
                    u(cin * k)?,
                    1,
                    u(k)?,
                    u(dilation)?,
                    u(len)?,
                ]);
                d.groups = [lout.div_ceil(64), cout.div_ceil(64), 1];
            }
            Math::ConvTranspose { len } => {
                let w = w?;
                let Shape::ConvTranspose {
                    cin,
                    cout,
                    k,
                    stride,
                    taps,
                } = w.shape
                else {
                    return None;
                };
                let full = (len - 1) * stride + k;
                d.kernel = Kernel::Gemm(GemmMode::ConvTranspose, w.format);
                d.bind_weight();
                let x = d.read(a, a_len);
                let y = d.write(o, out_len);
                d.bind(3, x).bind(4, y);
                d.push(&[
                    u(cout)?,
                    0,
                    u(cin * taps)?,
                    u(cin * taps)?,
                    0,
                    u(taps)?,
                    0,
                    u(len)?,
                    u(stride)?,
                    u(full)?,
                ]);
                d.groups = [
                    full.div_ceil(stride).div_ceil(64),
                    cout.div_ceil(64),
                    stride,
                ];
            }
            Math::Depthwise { len } => {
                let w = w?;
                let Shape::Depthwise { channels, k } = w.shape else {
                    return None;
                };
                let lout = len + 1 - k;
                d.kernel = Kernel::Depthwise;
                d.bind_weight();
                let x = d.read(a, a_len);
                let y = d.write(o, out_len);
                d.bind(3, x).bind(4, y);
                d.push(&[u(channels)?, u(k)?, u(len)?, u(lout)?]);
                d.groups = grid((channels * lout).div_ceil(256));
            }
            Math::RmsNorm { dim, eps } | Math::LayerNorm { dim, eps } => {
                let layer = matches!(self.math, Math::LayerNorm { .. });
                d.kernel = Kernel::Norm(if layer {
                    NormKind::Layer
                } else {
                    NormKind::Rms
                });
                let g = d.read(a, a_len);
                d.bind(0, g);
                if layer {
                    let b = d.read(b, b_len);
                    d.bind(1, b);
                }
                let x = d.read_write(o, out_len);
                d.bind(4, x);
                let rows = out_len / dim;
                d.push(&[u(dim)?, eps.to_bits(), u(rows)?]);
                d.groups = grid(rows);
            }
            Math::Rope {
                heads,
                head_dim,
                start_pos,
                theta,
            } => {
                let rows = out_len / (heads * head_dim);
                d.kernel = Kernel::Rope;
                let table = d.generated(rope_table(rows, head_dim, start_pos, theta));
                let x = d.read_write(o, out_len);
                d.bind(0, table).bind(4, x);
                d.push(&[u(rows)?, u(heads)?, u(head_dim / 2)?]);
                d.groups = grid((rows * heads * head_dim / 2).div_ceil(256));
            }
            Math::Attention { heads, span, scale } => {
                d.kernel = Kernel::Attention;
                let q = d.read(a, a_len);
                let k = d.read(b, b_len);
                let v = d.read(c, c_len);
                let o = d.write(o, out_len);
                d.bind(0, q).bind(1, k).bind(2, v).bind(4, o);
                // Only the distance between query and key positions matters (causality, window): positions
                // relative to the earlier start keep the push constants, and so the recorded stage, the same
                // from one chunk to the next.
                let origin = span.query_start.min(span.key_start);
                d.push(&[
                    u(heads.q_heads)?,
                    u(heads.kv_heads)?,
                    u(heads.head_dim)?,
                    u(span.queries)?,
                    u(span.query_start - origin)?,
                    u(span.keys)?,
                    u(span.key_start - origin)?,
                    u(span.window.unwrap_or(0))?,
                    scale.to_bits(),
                ]);
                d.groups = [heads.q_heads, span.queries, 1];
            }
            Math::SnakeBeta { len } => {
                d.kernel = Kernel::Eltwise(Activation::SnakeBeta);
                let alpha = d.read(a, a_len);
                let inv_beta = d.read(b, b_len);
                let x = d.read_write(o, out_len);
                d.bind(0, alpha).bind(1, inv_beta).bind(4, x);
                d.push(&[u(out_len)?, u(len)?]);
                d.groups = grid(out_len.div_ceil(256));
            }
            Math::Gelu | Math::Silu | Math::SiluMul => {
                d.kernel = Kernel::Eltwise(match self.math {
                    Math::Gelu => Activation::Gelu,
                    Math::Silu => Activation::Silu,
                    _ => Activation::SiluMul,
                });
                if matches!(self.math, Math::SiluMul) {
                    let up = d.read(a, a_len);
                    d.bind(0, up);
                }
                let x = d.read_write(o, out_len);
                d.bind(4, x);
                d.push(&[u(out_len)?, 0]);
                d.groups = grid(out_len.div_ceil(256));
            }
            Math::Strided { combine, shape } => {
                d.kernel = Kernel::Strided(combine);
                let src = d.read(a, a_len);
                // A copy over the whole destination needs none of its old values on the device.
                let dst = if combine == Combine::Copy && shape.covers_dst(out_len) {
                    d.write(o, out_len)
                } else {
                    d.read_write(o, out_len)
                };
                // A KV-cache append writes a few rows of a long buffer: only they need copying back.
                if let (Bind::Tensor(t), Some(range)) = (dst, shape.dst_range()) {
                    d.tensors[t].writes = Some(range);
                }
                d.bind(0, src).bind(4, dst);
                d.push(&[
                    u(shape.rows)?,
                    u(shape.cols)?,
                    u(shape.src.offset)?,
                    u(shape.src.row_stride)?,
                    u(shape.src.col_stride)?,
                    u(shape.dst.offset)?,
                    u(shape.dst.row_stride)?,
                    u(shape.dst.col_stride)?,
                ]);
                // Indices are 32-bit in the shader.
                u(shape.len())?;
                u(a_len)?;
                u(out_len)?;
                d.groups = grid(shape.len().div_ceil(256));
            }
        }
        Some(d)
    }
}

/// `cos[rows][half]` then `sin[rows][half]`, computed exactly as the CPU backend does.
fn rope_table(rows: usize, head_dim: usize, start_pos: usize, theta: f32) -> Vec<f32> {
    let half = head_dim / 2;
    let freqs: Vec<f32> = (0..half)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
        .collect();
    let mut table = vec![0.0f32; 2 * rows * half];
    for r in 0..rows {
        let pos = (start_pos + r) as f32;
        for (i, f) in freqs.iter().enumerate() {
            let angle = pos * f;
            table[r * half + i] = angle.cos();
            table[(rows + r) * half + i] = angle.sin();
        }
    }
    table
}

/// Workgroups for `n` independent groups: x up to 65535 (the minimum every device supports), then y.
fn grid(n: usize) -> [usize; 3] {
    const MAX_X: usize = 65_535;
    if n <= MAX_X {
        [n, 1, 1]
    } else {
        [MAX_X, n.div_ceil(MAX_X), 1]
    }
}

/// How a dispatch uses a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
    ReadWrite,
}

/// A tensor of the list a dispatch reads or writes, or data the plugin made for it.
pub struct Tensor {
    /// Index in the list's tensor table ([`NO_TENSOR`] for generated data).
    pub index: u32,
    pub len: usize,
    pub access: Access,
    /// Elements `lo..hi` an op that writes the tensor can change (`None`: all of it): only those are copied back.
    pub writes: Option<(usize, usize)>,
    /// Made by the plugin (the rope table): uploaded every run, never shared with another op.
    pub generated: Option<Vec<f32>>,
}

/// What a binding of a dispatch is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bind {
    Unused,
    WeightData,
    WeightScales,
    WeightBias,
    Tensor(usize),
}

/// One shader dispatch over tensors of a list.
pub struct Dispatch<'a> {
    pub kernel: Kernel,
    pub weight: Option<&'a GpuWeight>,
    pub tensors: Vec<Tensor>,
    pub bindings: [Bind; 5],
    pub push: [u32; PUSH_WORDS],
    pub groups: [usize; 3],
}

impl<'a> Dispatch<'a> {
    fn new(weight: Option<&'a GpuWeight>) -> Self {
        Dispatch {
            kernel: Kernel::Rope,
            weight,
            tensors: Vec::new(),
            bindings: [Bind::Unused; 5],
            push: [0; PUSH_WORDS],
            groups: [1; 3],
        }
    }

    /// A strided copy of one value over all `len` values of tensor `index`: what sets a tensor that starts as
    /// zeros ([`kazeia_backend_abi::list::TensorRecord::ZEROED`]) on the device.
    pub fn fill(index: u32, len: usize, value: f32) -> Option<Dispatch<'a>> {
        let n = u32::try_from(len).ok()?;
        let mut d = Dispatch::new(None);
        d.kernel = Kernel::Strided(Combine::Copy);
        let src = d.generated(vec![value]);
        let dst = d.write(index, len);
        d.bind(0, src).bind(4, dst);
        d.push(&[1, n, 0, 0, 0, 0, n, 1]);
        d.groups = grid(len.div_ceil(256));
        Some(d)
    }

    fn tensor(&mut self, index: u32, len: usize, access: Access) -> Bind {
        self.tensors.push(Tensor {
            index,
            len,
            access,
            writes: None,
            generated: None,
        });
        Bind::Tensor(self.tensors.len() - 1)
    }

    fn read(&mut self, index: u32, len: usize) -> Bind {
        self.tensor(index, len, Access::Read)
    }

    fn write(&mut self, index: u32, len: usize) -> Bind {
        self.tensor(index, len, Access::Write)
    }

    fn read_write(&mut self, index: u32, len: usize) -> Bind {
        self.tensor(index, len, Access::ReadWrite)
    }

    fn generated(&mut self, data: Vec<f32>) -> Bind {
        let len = data.len();
        self.tensors.push(Tensor {
            index: NO_TENSOR,
            len,
            access: Access::Read,
            writes: None,
            generated: Some(data),
        });
        Bind::Tensor(self.tensors.len() - 1)
    }

    fn bind(&mut self, binding: usize, what: Bind) -> &mut Self {
        self.bindings[binding] = what;
        self
    }

    /// Data, scales and bias of the weight on bindings 0, 1, 2 (those it has).
    fn bind_weight(&mut self) {
        let w = self.weight.expect("a weighted dispatch");
        self.bindings[0] = Bind::WeightData;
        if w.scales.is_some() {
            self.bindings[1] = Bind::WeightScales;
        }
        if w.bias.is_some() {
            self.bindings[2] = Bind::WeightBias;
        }
    }

    fn push(&mut self, words: &[u32]) {
        self.push[..words.len()].copy_from_slice(words);
    }
}
