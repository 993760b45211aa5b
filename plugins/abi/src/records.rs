//! Running an [`OpRecord`] through the [`Backend`] trait's own methods: what a backend without a better way to
//! take a list does with each op (the CPU plugins, and the default [`Backend::run_records`]).

use crate::plugin::{attention_of, OpKind, OpRecord};
use crate::{Backend, Weight};

/// A record's input buffer as a slice (empty when its length is 0).
///
/// # Safety
/// `ptr` must be valid for `len` floats for the returned lifetime.
pub unsafe fn input<'a>(ptr: *const f32, len: usize) -> Result<&'a [f32], String> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err("null buffer".into());
    }
    // SAFETY: non-null and, by this function's contract, valid for `len` floats for `'a`.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Runs one record on `backend`; its weight (if any) is a `*const Weight` that `backend` made.
///
/// # Safety
/// The record's pointers must be valid for their lengths, its output must not overlap its inputs, and its weight
/// must be null or a live `Weight`.
pub unsafe fn run_record<B: Backend + ?Sized>(backend: &B, op: &OpRecord) -> Result<(), String> {
    let kind = OpKind::from_code(op.kind).ok_or_else(|| format!("unknown op kind {}", op.kind))?;
    let weight = || -> Result<&Weight, String> {
        // SAFETY: null or a live `Weight` (this function's contract); `as_ref` turns null into `None`.
        unsafe { (op.weight as *const Weight).as_ref() }
            .ok_or_else(|| format!("a {kind:?} op without a weight"))
    };
    // SAFETY: each input pointer is valid for its length for this call (this function's contract).
    let (a, b, c) = unsafe {
        (
            input(op.a, op.a_len)?,
            input(op.b, op.b_len)?,
            input(op.c, op.c_len)?,
        )
    };
    if op.out.is_null() {
        return if op.out_len == 0 {
            Ok(())
        } else {
            Err("null output".into())
        };
    }
    // SAFETY: non-null, valid for `out_len` floats and disjoint from the inputs (this function's contract), so
    // the only live reference to that memory.
    let out = unsafe { std::slice::from_raw_parts_mut(op.out, op.out_len) };
    let n = op.n.map(|v| v as usize);
    match kind {
        OpKind::Linear => backend.linear(weight()?, a, n[0], out),
        OpKind::Conv1d => backend.conv1d(weight()?, a, n[0], n[1], out),
        OpKind::DepthwiseConv1d => backend.depthwise_conv1d(weight()?, a, n[0], out),
        OpKind::ConvTranspose1d => backend.conv_transpose1d(weight()?, a, n[0], out),
        OpKind::RmsNorm => backend.rms_norm(out, n[0], a, op.f[0]),
        OpKind::LayerNorm => backend.layer_norm(out, n[0], a, b, op.f[0]),
        OpKind::Rope => backend.rope(out, n[0], n[1], n[2], op.f[0]),
        OpKind::Attention => {
            let (heads, span) = attention_of(op.n);
            backend.attention(a, b, c, heads, span, op.f[0], out)
        }
        OpKind::SnakeBeta => backend.snake_beta(out, n[0], a, b),
        OpKind::Gelu => backend.gelu(out),
        OpKind::Silu => backend.silu(out),
        OpKind::SiluMul => backend.silu_mul(out, a),
        OpKind::Discard | OpKind::Resident => {}
        OpKind::Fill => out.fill(op.f[0]),
        OpKind::Copy | OpKind::Add | OpKind::Mul => {
            let shape = op.strided_shape().ok_or("a strided op's sizes overflow")?;
            shape.check(a.len(), out.len())?;
            let combine = kind.combine().expect("a strided kind");
            backend.strided(combine, a, out, shape)
        }
    }
    Ok(())
}
