//! The cases: every op kind at the models' shapes (Qwen3-TTS 0.6B's talker and code predictor, hidden 1024,
//! 16 query and 8 key-value heads of 128; the codec decoder's convolutions, upsamplers and SnakeBeta) and at
//! awkward ones (odd sizes, one row, partial tiles and blocks, the matvec/GEMM boundary at 8 rows, long
//! sequences, windows, heads past a kernel's width, grids past the dispatch limits), in every weight format the
//! op takes (linear layers: f32, f16, bf16, q8_0, q4_0; convolutions: f32, f16). [`at_load`] is the small
//! subset a backend checks when it starts (Vulkan's self-test); [`all`] adds the rest.
//!
//! To add a case, add a line to [`at_load`] or [`more`]; what a case computes is [`crate::Case::reference`].

use kazeia_backend_abi::plugin::OpKind;
use kazeia_backend_abi::{AttentionSpan, Combine, Heads, Strided, View, WeightFormat};

use crate::{Case, Shape};

/// The formats a linear layer is held in.
pub const LINEAR_FORMATS: [WeightFormat; 5] = [
    WeightFormat::F32,
    WeightFormat::F16,
    WeightFormat::BF16,
    WeightFormat::Q8_0,
    WeightFormat::Q4_0,
];

/// The formats a convolution (not depthwise) is held in.
pub const CONV_FORMATS: [WeightFormat; 2] = [WeightFormat::F32, WeightFormat::F16];

/// Every case: [`at_load`]'s and [`more`]'s.
pub fn all() -> Vec<Case> {
    let mut cases = at_load();
    cases.extend(more());
    cases
}

/// What `cases` leaves out: an op kind without a case, or a weighted kind without one in each of its formats
/// (so a new op kind or format fails every backend's suite until it has cases).
pub fn missing(cases: &[Case]) -> Vec<String> {
    let mut missing = Vec::new();
    for kind in OpKind::ALL {
        let formats: &[WeightFormat] = match kind {
            OpKind::Linear => &LINEAR_FORMATS,
            OpKind::Conv1d | OpKind::ConvTranspose1d => &CONV_FORMATS,
            OpKind::DepthwiseConv1d => &[WeightFormat::F32],
            _ => &[],
        };
        if !cases.iter().any(|c| c.kind == kind) {
            missing.push(format!("no case of {kind:?}"));
        }
        for &format in formats {
            if !cases
                .iter()
                .any(|c| c.kind == kind && c.format == Some(format))
            {
                missing.push(format!("no case of {kind:?} in {format}"));
            }
        }
    }
    missing
}

/// The small cases a backend runs when it starts (Vulkan's self-test: each kernel once on shapes that reach
/// its edge cases — partial tiles and blocks, several key blocks, grouped heads, windows, a query that sees no
/// key).
pub fn at_load() -> Vec<Case> {
    let mut c = Vec::new();
    for format in LINEAR_FORMATS {
        // 3 rows: the matvec kernel; 19: the GEMM, partial tiles both ways.
        c.push(linear("at load, matvec", format, 37, 80, 3, true));
        c.push(linear("at load, gemm", format, 70, 45, 19, true));
    }
    for format in CONV_FORMATS {
        c.push(conv1d("at load", format, 9, 5, 7, 3, 60));
        c.push(conv_transpose1d("at load", format, 6, 5, 10, 4, 7));
    }
    c.push(depthwise("at load", 6, 7, 30));
    for kind in [OpKind::Gelu, OpKind::Silu, OpKind::SiluMul] {
        c.push(activation("at load", kind, 1000, 6.0));
    }
    c.push(snake_beta("at load", 4, 250, 1.0, 6.0));
    c.push(norm("at load", OpKind::RmsNorm, 3, 100, 1e-6));
    c.push(norm("at load", OpKind::LayerNorm, 3, 100, 1e-5));
    c.push(rope("at load", 3, 2, 16, 1000, 10_000.0));
    let grouped = heads(4, 2, 72);
    c.push(attention(
        "at load, 2 key blocks",
        grouped,
        span(5, 75, 80, 0, None),
    ));
    c.push(attention(
        "at load, window",
        grouped,
        span(5, 78, 80, 3, Some(70)),
    ));
    // The first query sees no key: its output is zero.
    c.push(attention(
        "at load, a query sees no key",
        grouped,
        span(5, 9, 80, 10, None),
    ));
    for combine in [Combine::Copy, Combine::Add, Combine::Mul] {
        let (rows, cols) = (37, 70);
        let dst_len = rows * cols + 5 + 3 * cols;
        // A transpose into the middle of a wider buffer.
        c.push(strided(
            "at load, transpose",
            combine,
            Strided {
                rows,
                cols,
                src: View::rows(0, cols),
                dst: View {
                    offset: 5,
                    row_stride: 1,
                    col_stride: rows + 3,
                },
            },
            rows * cols,
            dst_len,
        ));
        // A per-row value broadcast over a partial view (zero source stride, destination offset).
        c.push(strided(
            "at load, broadcast",
            combine,
            Strided {
                rows: rows - 1,
                cols: cols / 2,
                src: View {
                    offset: 7,
                    row_stride: 1,
                    col_stride: 0,
                },
                dst: View::rows(cols / 2, cols),
            },
            rows * cols,
            dst_len,
        ));
    }
    c
}

/// The cases past [`at_load`]: the models' shapes and the awkward ones.
pub fn more() -> Vec<Case> {
    let mut c = Vec::new();
    for format in LINEAR_FORMATS {
        // Around the matvec/GEMM boundary (8 rows) and a prefill; square, odd (inputs not a multiple of 32),
        // and a long reduction.
        for (out, inp) in [(64, 64), (37, 80), (130, 1024)] {
            for rows in [1, 2, 8, 9, 70] {
                c.push(linear("", format, out, inp, rows, true));
            }
        }
        // The talker's and code predictor's projections (0.6B): a step's q_proj, the MLP's up and down, a
        // prefill through the up projection; one without bias (as the models' are).
        c.push(linear("talker q_proj step", format, 2048, 1024, 1, false));
        c.push(linear("mlp down step", format, 1024, 3072, 1, false));
        c.push(linear("mlp up prefill", format, 3072, 1024, 33, false));
        c.push(linear("one output", format, 1, 33, 5, true));
    }
    for format in CONV_FORMATS {
        // BigVGAN's residual convolutions (k7, dilations 1/3/9, then k1), the output conv to one channel, the
        // pre-conv, one of the decoder's wider layers.
        for (cout, cin, k, dilation, len) in [
            (24, 24, 7, 1, 100),
            (24, 24, 7, 3, 100),
            (24, 24, 7, 9, 160),
            (24, 24, 1, 1, 100),
            (1, 12, 7, 1, 300),
            (70, 33, 3, 1, 20),
            (256, 256, 7, 1, 46),
        ] {
            c.push(conv1d("", format, cout, cin, k, dilation, len));
        }
        // The upsamplers (k = 2·rate) and odd ones (k not a multiple of the stride, one column).
        for (cin, cout, k, stride, len) in [
            (32, 16, 16, 8, 5),
            (16, 8, 10, 5, 9),
            (8, 4, 6, 3, 1),
            (6, 5, 7, 2, 11),
            (384, 192, 16, 8, 4),
        ] {
            c.push(conv_transpose1d("", format, cin, cout, k, stride, len));
        }
    }
    // More output columns than 65535 workgroups of 64 cover (Vulkan's minimum dispatch, lavapipe's): a device
    // with that limit refuses it by shape.
    let past = 64 * 65_535 + 100;
    c.push(conv1d(
        "past the dispatch minimum",
        WeightFormat::F32,
        3,
        2,
        2,
        1,
        past,
    ));
    c.push(conv_transpose1d(
        "past the dispatch minimum",
        WeightFormat::F32,
        2,
        3,
        2,
        1,
        past,
    ));
    c.push(depthwise("", 40, 7, 50));
    c.push(depthwise("decoder ConvNeXt", 1024, 7, 46));
    for kind in [OpKind::Gelu, OpKind::Silu, OpKind::SiluMul] {
        c.push(activation("", kind, 5 * 1024, 4.0));
        c.push(activation("odd length", kind, 1001, 4.0));
    }
    // SnakeBeta with the large arguments a trained alpha gives.
    c.push(snake_beta("large arguments", 8, 640, 3.0, 30.0));
    c.push(snake_beta("decoder", 96, 161, 1.0, 4.0));
    for kind in [OpKind::RmsNorm, OpKind::LayerNorm] {
        c.push(norm("", kind, 5, 1024, 1e-6));
        c.push(norm("one row", kind, 1, 1024, 1e-6));
        c.push(norm("odd width", kind, 7, 33, 1e-5));
    }
    // The talker's RoPE (16 heads of 128) far into a sequence; the code predictor's one row.
    c.push(rope("talker", 3, 16, 128, 1500, 1_000_000.0));
    c.push(rope("code predictor step", 1, 16, 128, 14, 1_000_000.0));
    let talker = heads(16, 8, 128);
    c.push(attention(
        "talker step, long cache",
        talker,
        span(1, 700, 701, 0, None),
    ));
    c.push(attention(
        "talker step, longer cache",
        talker,
        span(1, 2047, 2048, 0, None),
    ));
    c.push(attention(
        "talker prefill",
        talker,
        span(40, 0, 40, 0, None),
    ));
    c.push(attention(
        "long prefill",
        talker,
        span(150, 0, 150, 0, None),
    ));
    c.push(attention(
        "decoder window",
        heads(4, 4, 64),
        span(30, 100, 102, 28, Some(72)),
    ));
    // Heads at and past 256 (Vulkan's kernel's width).
    for head_dim in [256, 320] {
        c.push(attention(
            "wide heads",
            heads(2, 1, head_dim),
            span(3, 5, 8, 0, None),
        ));
    }
    c
}

fn linear(
    note: &str,
    format: WeightFormat,
    out: usize,
    inp: usize,
    rows: usize,
    bias: bool,
) -> Case {
    let shape = Shape::Linear {
        out,
        inp,
        rows,
        bias,
    };
    Case::new(OpKind::Linear, Some(format), shape, note)
}

fn conv1d(
    note: &str,
    format: WeightFormat,
    cout: usize,
    cin: usize,
    k: usize,
    dilation: usize,
    len: usize,
) -> Case {
    let shape = Shape::Conv1d {
        cout,
        cin,
        k,
        dilation,
        len,
    };
    Case::new(OpKind::Conv1d, Some(format), shape, note)
}

fn conv_transpose1d(
    note: &str,
    format: WeightFormat,
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
    len: usize,
) -> Case {
    let shape = Shape::ConvTranspose1d {
        cin,
        cout,
        k,
        stride,
        len,
    };
    Case::new(OpKind::ConvTranspose1d, Some(format), shape, note)
}

fn depthwise(note: &str, channels: usize, k: usize, len: usize) -> Case {
    let shape = Shape::DepthwiseConv1d { channels, k, len };
    Case::new(
        OpKind::DepthwiseConv1d,
        Some(WeightFormat::F32),
        shape,
        note,
    )
}

fn activation(note: &str, kind: OpKind, len: usize, scale: f32) -> Case {
    Case::new(kind, None, Shape::Elementwise { len, scale }, note)
}

fn snake_beta(note: &str, channels: usize, len: usize, log_alpha: f32, scale: f32) -> Case {
    let shape = Shape::SnakeBeta {
        channels,
        len,
        log_alpha,
        scale,
    };
    Case::new(OpKind::SnakeBeta, None, shape, note)
}

fn norm(note: &str, kind: OpKind, rows: usize, dim: usize, eps: f32) -> Case {
    Case::new(kind, None, Shape::Norm { rows, dim, eps }, note)
}

fn rope(note: &str, rows: usize, heads: usize, head_dim: usize, start: usize, theta: f32) -> Case {
    let shape = Shape::Rope {
        rows,
        heads,
        head_dim,
        start_pos: start,
        theta,
    };
    Case::new(OpKind::Rope, None, shape, note)
}

fn heads(q_heads: usize, kv_heads: usize, head_dim: usize) -> Heads {
    Heads {
        q_heads,
        kv_heads,
        head_dim,
    }
}

fn span(
    queries: usize,
    query_start: usize,
    keys: usize,
    key_start: usize,
    window: Option<usize>,
) -> AttentionSpan {
    AttentionSpan {
        queries,
        query_start,
        keys,
        key_start,
        window,
    }
}

fn attention(note: &str, heads: Heads, span: AttentionSpan) -> Case {
    Case::new(
        OpKind::Attention,
        None,
        Shape::Attention { heads, span },
        note,
    )
}

fn strided(note: &str, combine: Combine, shape: Strided, src_len: usize, dst_len: usize) -> Case {
    let shape = Shape::Strided {
        shape,
        src_len,
        dst_len,
    };
    Case::new(OpKind::from(combine), None, shape, note)
}
