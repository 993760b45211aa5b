//! Running op lists on the CPU backend: each op's operands as slices, then the op's method. What the CPU
//! backend's [`Backend::run_list`](kazeia_backend_abi::Backend::run_list) does, and what the engine and the device
//! plugins call ([`run_op`]) for an op their device does not run.

use kazeia_backend_abi::list::{List, OpRecord, NO_TENSOR};
use kazeia_backend_abi::plugin::{attention_of, OpKind};
use kazeia_backend_abi::Weight;

use crate::conv::{ConvTransposeWeight, ConvWeight, DepthwiseWeight};
use crate::{CpuBackend, LinearWeight};

/// Runs one op on `cpu` over its operands `a`, `b`, `c` (empty where absent) and `out`; its weight, if it has
/// one, is a `*const Weight` the CPU backend made (checked: another backend's is an error).
///
/// # Safety
/// The record's weight must be null or a live `Weight`.
pub unsafe fn run_op(
    cpu: &CpuBackend,
    op: &OpRecord,
    [a, b, c]: [&[f32]; 3],
    out: &mut [f32],
) -> Result<(), String> {
    let kind = OpKind::from_code(op.kind).ok_or_else(|| format!("unknown op kind {}", op.kind))?;
    let weight = || -> Result<&Weight, String> {
        // SAFETY: null or a live `Weight` (this function's contract); `as_ref` turns null into `None`.
        let w = unsafe { (op.weight as *const Weight).as_ref() }
            .ok_or_else(|| format!("a {kind:?} op without a weight"))?;
        let ours = match kind {
            OpKind::Linear => w.downcast::<LinearWeight>().is_some(),
            OpKind::Conv1d => w.downcast::<ConvWeight>().is_some(),
            OpKind::DepthwiseConv1d => w.downcast::<DepthwiseWeight>().is_some(),
            _ => w.downcast::<ConvTransposeWeight>().is_some(),
        };
        if ours {
            Ok(w)
        } else {
            Err(format!(
                "a {kind:?} op with a weight the CPU backend did not make"
            ))
        }
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
        OpKind::Copy | OpKind::Add | OpKind::Mul => {
            let shape = op.strided_shape().ok_or("a strided op's sizes overflow")?;
            shape.check(a.len(), out.len())?;
            let combine = kind.combine().expect("a strided kind");
            cpu.strided(combine, a, out, shape)
        }
    }
    Ok(())
}

/// Runs a list on `cpu`: its intermediate results (no host flag) are allocated for the call (zeros), a zeroed host
/// tensor is cleared first, then each op in order on its operands.
///
/// # Safety
/// As [`Backend::run_list`](kazeia_backend_abi::Backend::run_list): a well-formed list whose host memory is
/// valid, unshared and non-overlapping for the call, and whose weights are null or live `Weight`s.
pub unsafe fn run_list(cpu: &CpuBackend, list: List<'_>) -> Result<(), String> {
    let run = |op: &OpRecord, inputs: [&[f32]; 3], out: &mut [f32]| {
        // SAFETY: every weight is null or a live `Weight` (this function's contract).
        unsafe { run_op(cpu, op, inputs, out) }
    };
    // SAFETY: the list's memory follows this function's contract.
    unsafe { each_op(list, run) }
}

/// Calls `f(op, [a, b, c], out)` for each op of `list` in order, on its operands as slices: an intermediate
/// result (a tensor with no host flag, whatever its `host` field) is allocated (zeros) at its first op and freed
/// after its last, so a list holds no more at once than its ops ran one by one would; the others are used in
/// place in host memory, the zeroed ones cleared first. For a backend that runs lists on
/// host memory (the CPU, and the Hexagon plugin, whose DSP shares it).
///
/// # Safety
/// As [`run_list`] for the list's memory.
pub unsafe fn each_op(
    list: List<'_>,
    mut f: impl FnMut(&OpRecord, [&[f32]; 3], &mut [f32]) -> Result<(), String>,
) -> Result<(), String> {
    let tensors = list.tensors;
    // The op after which each intermediate result is no longer needed.
    let mut last_use = vec![0usize; tensors.len()];
    for (i, op) in list.ops.iter().enumerate() {
        for t in op.operands() {
            if let Some(last) = last_use.get_mut(t as usize) {
                *last = i;
            }
        }
    }
    let mut held: Vec<Option<Vec<f32>>> = (0..tensors.len()).map(|_| None).collect();
    for t in tensors.iter().filter(|t| !t.is_scratch() && t.zeroed()) {
        // SAFETY: host memory valid for `len` values and unshared for the call (the contract).
        unsafe { std::slice::from_raw_parts_mut(t.host, t.len) }.fill(0.0);
    }
    for (i, op) in list.ops.iter().enumerate() {
        for t in op.operands() {
            let t = t as usize;
            if tensors.get(t).is_some_and(|r| r.is_scratch()) && held[t].is_none() {
                held[t] = Some(vec![0.0; tensors[t].len]);
            }
        }
        let place = |t: usize| -> *mut f32 {
            match &held[t] {
                Some(v) => v.as_ptr() as *mut f32,
                None => tensors[t].host,
            }
        };
        let tensor = |t: u32| -> &[f32] {
            if t == NO_TENSOR || tensors[t as usize].len == 0 {
                return &[];
            }
            // SAFETY: each tensor's memory (the caller's, or allocated above) is valid for its length for the
            // call, and an op's inputs are other tensors than its output (the list is well formed), so this
            // shared view aliases no mutable one.
            unsafe { std::slice::from_raw_parts(place(t as usize), tensors[t as usize].len) }
        };
        let out_len = tensors[op.out as usize].len;
        let out: &mut [f32] = if out_len == 0 {
            &mut []
        } else {
            // SAFETY: as above; the output is the one mutable view of its tensor during the op.
            unsafe { std::slice::from_raw_parts_mut(place(op.out as usize), out_len) }
        };
        f(op, op.inputs.map(tensor), out).map_err(|e| format!("op {i}: {e}"))?;
        for t in op.operands() {
            if last_use.get(t as usize) == Some(&i) {
                held[t as usize] = None;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use kazeia_backend_abi::list::{List, TensorRecord};
    use kazeia_backend_abi::plugin::strided_n;
    use kazeia_backend_abi::Strided;

    use super::*;

    #[test]
    fn host_memory_is_used_only_for_the_host_flags() {
        // x (HOST_IN) → t (no host flag, though it points at host memory) → gelu → y (HOST_OUT).
        let cpu = CpuBackend::new(1);
        let x = [1.0f32, -2.0, 3.0];
        let mut elsewhere = [7.0f32; 3];
        let mut y = [0.0f32; 3];
        let tensors = [
            TensorRecord::host(x.as_ptr() as *mut f32, 3, TensorRecord::HOST_IN),
            TensorRecord::host(elsewhere.as_mut_ptr(), 3, 0),
            TensorRecord::host(y.as_mut_ptr(), 3, TensorRecord::HOST_OUT),
        ];
        let copy = |from: u32, to: u32| {
            let mut op = OpRecord::new(OpKind::Copy);
            op.inputs[0] = from;
            op.out = to;
            op.n = strided_n(Strided::contiguous(3));
            op
        };
        let mut gelu = OpRecord::new(OpKind::Gelu);
        gelu.out = 1;
        let ops = [copy(0, 1), gelu, copy(1, 2)];
        let list = List {
            tensors: &tensors,
            ops: &ops,
        };
        list.check().unwrap();
        // SAFETY: every host pointer is a live local array of its tensor's length, no two overlap, no weights.
        unsafe { run_list(&cpu, list) }.unwrap();
        let mut want = x;
        cpu.gelu(&mut want);
        assert_eq!(y, want);
        assert_eq!(
            elsewhere, [7.0; 3],
            "an intermediate result stays in the backend"
        );
    }
}
