//! Running an [`OpRecord`] on the CPU backend: the record's buffers as slices, then the op's method. What the
//! CPU backend's [`Backend::run_records`](kazeia_backend_abi::Backend::run_records) does with each record, and
//! what the engine and the device plugins call for a record their device does not run.

use kazeia_backend_abi::plugin::{attention_of, OpKind, OpRecord};
use kazeia_backend_abi::records::{input, output};
use kazeia_backend_abi::Weight;

use crate::CpuBackend;

/// Runs one record on `cpu`; its weight (if any) is a `*const Weight` the CPU backend made.
///
/// # Safety
/// The record's pointers must be valid for their lengths, its output must not overlap its inputs, and its weight
/// must be null or a live `Weight`.
pub unsafe fn run_record(cpu: &CpuBackend, op: &OpRecord) -> Result<(), String> {
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
    // SAFETY: valid for `out_len` floats and disjoint from the inputs (this function's contract).
    let Some(out) = (unsafe { output(op.out, op.out_len)? }) else {
        return Ok(());
    };
    let n = op.n.map(|v| v as usize);
    match kind {
        OpKind::Linear => cpu.linear(weight()?, a, n[0], out),
        OpKind::Conv1d => cpu.conv1d(weight()?, a, n[0], n[1], out),
        OpKind::DepthwiseConv1d => cpu.depthwise_conv1d(weight()?, a, n[0], out),
        OpKind::ConvTranspose1d => cpu.conv_transpose1d(weight()?, a, n[0], out),
        OpKind::RmsNorm => cpu.rms_norm(out, n[0], a, op.f[0]),
        OpKind::LayerNorm => cpu.layer_norm(out, n[0], a, b, op.f[0]),
        OpKind::Rope => cpu.rope(out, n[0], n[1], n[2], op.f[0]),
        OpKind::Attention => {
            let (heads, span) = attention_of(op.n);
            cpu.attention(a, b, c, heads, span, op.f[0], out)
        }
        OpKind::SnakeBeta => cpu.snake_beta(out, n[0], a, b),
        OpKind::Gelu => cpu.gelu(out),
        OpKind::Silu => cpu.silu(out),
        OpKind::SiluMul => cpu.silu_mul(out, a),
        OpKind::Discard | OpKind::Resident => {}
        OpKind::Fill => out.fill(op.f[0]),
        OpKind::Copy | OpKind::Add | OpKind::Mul => {
            let shape = op.strided_shape().ok_or("a strided op's sizes overflow")?;
            shape.check(a.len(), out.len())?;
            let combine = kind.combine().expect("a strided kind");
            cpu.strided(combine, a, out, shape)
        }
    }
    Ok(())
}
