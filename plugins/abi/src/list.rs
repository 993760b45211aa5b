//! What crosses to a backend when it runs ops: a list of [`OpRecord`]s over a table of [`TensorRecord`]s.
//!
//! A tensor's identity is its index in the list's table: ops name their operands by that index, never by
//! address, so which op feeds which is explicit and a backend never looks at a pointer's value. Host memory is
//! only where values cross: where a [`TensorRecord::HOST_IN`] tensor's values are read from before the list, and
//! where a [`TensorRecord::HOST_OUT`] one's are written to after it; [`TensorRecord::ZEROED`] asks for zeros to
//! start from. A tensor with neither host flag is an intermediate result of the list: a device keeps it to
//! itself (no transfer at all), a host backend allocates it for the list, and its `host` field, if set, is not
//! used. A tensor may also be *resident* ([`TensorRecord::resident`]): a stable id naming it across lists (a KV
//! cache), under which a device may keep its copy instead of reading it from host memory each time. Because a
//! list's structure (ops, operand indices, sizes, resident ids) is the same each time the model runs the same
//! stage, a device can record it once and replay it.

use std::ffi::c_void;
use std::marker::PhantomData;

use crate::plugin::{attention_n, strided_n, OpKind};
use crate::{AttentionSpan, Combine, Heads, Strided, Weight};

/// An absent operand.
pub const NO_TENSOR: u32 = u32::MAX;

/// One tensor of a list: `len` `f32` values.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TensorRecord {
    /// Values.
    pub len: usize,
    /// Where the host holds the tensor (at least `capacity` values): read before the list when it is
    /// [`TensorRecord::HOST_IN`], written after it when it is [`TensorRecord::HOST_OUT`], used for nothing else
    /// (never as the tensor's identity). Null for an intermediate result.
    pub host: *mut f32,
    /// [`TensorRecord::HOST_IN`], [`TensorRecord::HOST_OUT`], [`TensorRecord::ZEROED`].
    pub flags: u32,
    /// 0, or a stable id naming the tensor from list to list (a KV cache): under one id its values change only
    /// through ops of this backend's lists (the engine takes a new id when it writes them itself), so a device
    /// may keep its copy under the id and read from host memory only the values it has not seen. Needs both host
    /// flags: the host memory is where unseen values come from and where the list's writes go back.
    pub resident: u64,
    /// Values the host memory holds from `host` on (≥ `len`; a resident tensor grows within it from list to
    /// list, so a device may size its copy to it once).
    pub capacity: usize,
}

impl TensorRecord {
    /// The host values are the tensor's contents before the list (uploaded by a device where an op reads them).
    pub const HOST_IN: u32 = 1;
    /// The host reads the tensor after the list: what the list's ops wrote must be in host memory then.
    pub const HOST_OUT: u32 = 2;
    /// The tensor starts as zeros (its host values, if any, are not read): set where it lives, not uploaded.
    pub const ZEROED: u32 = 4;

    /// A tensor with no host memory, for this list only.
    pub fn scratch(len: usize, zeroed: bool) -> Self {
        TensorRecord {
            len,
            host: std::ptr::null_mut(),
            flags: if zeroed { Self::ZEROED } else { 0 },
            resident: 0,
            capacity: len,
        }
    }

    /// `len` values at `host` with `flags`.
    pub fn host(host: *mut f32, len: usize, flags: u32) -> Self {
        TensorRecord {
            len,
            host,
            flags,
            resident: 0,
            capacity: len,
        }
    }

    /// An intermediate result: neither [`TensorRecord::HOST_IN`] nor [`TensorRecord::HOST_OUT`], so it lives in
    /// the backend for the list only, whatever its `host` field holds.
    pub fn is_scratch(&self) -> bool {
        !self.host_in() && !self.host_out()
    }

    pub fn host_in(&self) -> bool {
        self.flags & Self::HOST_IN != 0
    }

    pub fn host_out(&self) -> bool {
        self.flags & Self::HOST_OUT != 0
    }

    pub fn zeroed(&self) -> bool {
        self.flags & Self::ZEROED != 0
    }
}

/// One op: its kind ([`OpKind`], which documents each field's meaning for it), weight, operands and sizes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OpRecord {
    pub kind: u32,
    /// The backend's weight handle (in Rust, a `*const Weight` the backend made), or null.
    pub weight: *const c_void,
    /// Tensor indices of the inputs `a`, `b`, `c` ([`NO_TENSOR`] when absent).
    pub inputs: [u32; 3],
    /// Tensor index of the output.
    pub out: u32,
    pub n: [u64; 8],
    pub f: [f32; 2],
}

impl OpRecord {
    pub fn new(kind: OpKind) -> Self {
        OpRecord {
            kind: kind as u32,
            weight: std::ptr::null(),
            inputs: [NO_TENSOR; 3],
            out: NO_TENSOR,
            n: [0; 8],
            f: [0.0; 2],
        }
    }

    /// The shape of a strided op's record (`None` when a value does not fit this machine's `usize`).
    pub fn strided_shape(&self) -> Option<Strided> {
        crate::plugin::strided_of(self.n)
    }

    /// The operands' tensor indices: `a`, `b`, `c`, then the output.
    pub fn operands(&self) -> [u32; 4] {
        [self.inputs[0], self.inputs[1], self.inputs[2], self.out]
    }
}

/// A list as it crosses the plugin table.
#[repr(C)]
pub struct OpList {
    pub tensors: *const TensorRecord,
    pub tensor_count: usize,
    pub ops: *const OpRecord,
    pub op_count: usize,
}

/// A list of ops over its tensors, as a backend receives it.
#[derive(Clone, Copy, Debug)]
pub struct List<'a> {
    pub tensors: &'a [TensorRecord],
    pub ops: &'a [OpRecord],
}

impl<'a> List<'a> {
    /// The C form, valid while `self`'s slices are borrowed.
    pub fn raw(&self) -> OpList {
        OpList {
            tensors: self.tensors.as_ptr(),
            tensor_count: self.tensors.len(),
            ops: self.ops.as_ptr(),
            op_count: self.ops.len(),
        }
    }

    /// Tensor `t`'s length (0 for [`NO_TENSOR`]).
    pub fn len_of(&self, t: u32) -> usize {
        self.tensors.get(t as usize).map_or(0, |t| t.len)
    }

    /// An op's operand lengths: `a`, `b`, `c`, output (0 where absent).
    pub fn lens(&self, op: &OpRecord) -> [usize; 4] {
        op.operands().map(|t| self.len_of(t))
    }

    /// Whether the list is well formed: every operand index names a tensor, every op has an output and reads
    /// none of its own output, a host flag comes with host memory, `capacity ≥ len`, and a resident tensor has
    /// both host flags. The buffers themselves are not read.
    pub fn check(&self) -> Result<(), String> {
        for (i, t) in self.tensors.iter().enumerate() {
            if t.host.is_null() && !t.is_scratch() {
                return Err(format!("tensor {i}: host flags without host memory"));
            }
            if t.resident != 0 && !(t.host_in() && t.host_out()) {
                return Err(format!("tensor {i}: a resident id without both host flags"));
            }
            if t.capacity < t.len {
                return Err(format!(
                    "tensor {i}: capacity {} below its length {}",
                    t.capacity, t.len
                ));
            }
        }
        let count = self.tensors.len();
        for (i, op) in self.ops.iter().enumerate() {
            let kind = OpKind::from_code(op.kind)
                .ok_or_else(|| format!("op {i}: unknown kind {}", op.kind))?;
            if op.out as usize >= count {
                return Err(format!("op {i} ({kind:?}): no output tensor"));
            }
            for &t in &op.inputs {
                if t != NO_TENSOR && t as usize >= count {
                    return Err(format!("op {i} ({kind:?}): no tensor {t}"));
                }
                if t == op.out {
                    return Err(format!("op {i} ({kind:?}) reads its own output"));
                }
            }
            if kind.has_weight() && op.weight.is_null() {
                return Err(format!("op {i}: a {kind:?} op without a weight"));
            }
        }
        Ok(())
    }
}

impl OpList {
    /// The list this describes.
    ///
    /// # Safety
    /// `tensors` and `ops` must be null with a count of 0, or valid for their counts for `'a`.
    pub unsafe fn list<'a>(&self) -> Result<List<'a>, String> {
        // SAFETY: valid for their counts for 'a, or empty (this function's contract).
        unsafe {
            Ok(List {
                tensors: slice(self.tensors, self.tensor_count)?,
                ops: slice(self.ops, self.op_count)?,
            })
        }
    }
}

/// # Safety
/// `ptr` must be valid for `len` values for `'a` when `len > 0`.
unsafe fn slice<'a, T>(ptr: *const T, len: usize) -> Result<&'a [T], String> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err("null array in an op list".into());
    }
    // SAFETY: non-null and valid for `len` values for 'a (this function's contract).
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// A list over host slices, built in Rust (tests, tools, and one op on host buffers): each slice becomes a host
/// tensor borrowed for `'a`, so the list's pointers stay valid while it lives.
#[derive(Default)]
pub struct HostList<'a> {
    tensors: Vec<TensorRecord>,
    ops: Vec<OpRecord>,
    _borrows: PhantomData<&'a mut [f32]>,
}

impl<'a> HostList<'a> {
    pub fn new() -> Self {
        HostList {
            tensors: Vec::new(),
            ops: Vec::new(),
            _borrows: PhantomData,
        }
    }

    fn push(&mut self, t: TensorRecord) -> u32 {
        self.tensors.push(t);
        (self.tensors.len() - 1) as u32
    }

    /// Values the ops read (never written).
    pub fn input(&mut self, x: &'a [f32]) -> u32 {
        self.push(TensorRecord::host(
            x.as_ptr() as *mut f32,
            x.len(),
            TensorRecord::HOST_IN,
        ))
    }

    /// A result the ops write whole, read on the host afterwards.
    pub fn output(&mut self, y: &'a mut [f32]) -> u32 {
        self.push(TensorRecord::host(
            y.as_mut_ptr(),
            y.len(),
            TensorRecord::HOST_OUT,
        ))
    }

    /// Values the ops read and update, read on the host afterwards.
    pub fn in_out(&mut self, y: &'a mut [f32]) -> u32 {
        self.push(TensorRecord::host(
            y.as_mut_ptr(),
            y.len(),
            TensorRecord::HOST_IN | TensorRecord::HOST_OUT,
        ))
    }

    /// An intermediate result with no host memory.
    pub fn scratch(&mut self, len: usize, zeroed: bool) -> u32 {
        self.push(TensorRecord::scratch(len, zeroed))
    }

    /// Tensor `t` made resident under `id` ([`TensorRecord::resident`]).
    pub fn resident(&mut self, t: u32, id: u64) -> &mut Self {
        self.tensors[t as usize].resident = id;
        self
    }

    /// Appends an op.
    pub fn op(
        &mut self,
        kind: OpKind,
        weight: Option<&'a Weight>,
        inputs: [Option<u32>; 3],
        out: u32,
        n: [u64; 8],
        f: f32,
    ) -> &mut Self {
        let mut op = OpRecord::new(kind);
        op.weight = weight.map_or(std::ptr::null(), |w| w as *const Weight as *const c_void);
        op.inputs = inputs.map(|t| t.unwrap_or(NO_TENSOR));
        op.out = out;
        op.n = n;
        op.f[0] = f;
        self.ops.push(op);
        self
    }

    pub fn list(&self) -> List<'_> {
        List {
            tensors: &self.tensors,
            ops: &self.ops,
        }
    }

    /// One op with weight `w`, input `x` and output `y`: `n = [n0, n1, 0…]`.
    pub fn weighted(
        kind: OpKind,
        w: &'a Weight,
        x: &'a [f32],
        y: &'a mut [f32],
        n: [usize; 2],
    ) -> Self {
        let mut l = HostList::new();
        let (x, y) = (l.input(x), l.output(y));
        l.op(kind, Some(w), [Some(x), None, None], y, sizes(&n), 0.0);
        l
    }

    /// One op on `x` in place with parameter buffers `a`, `b` (empty: absent): `n = [n0, n1, n2, 0…]`.
    pub fn in_place(
        kind: OpKind,
        x: &'a mut [f32],
        a: &'a [f32],
        b: &'a [f32],
        n: [usize; 3],
        f: f32,
    ) -> Self {
        let mut l = HostList::new();
        let x = l.in_out(x);
        let a = (!a.is_empty()).then(|| l.input(a));
        let b = (!b.is_empty()).then(|| l.input(b));
        l.op(kind, None, [a, b, None], x, sizes(&n), f);
        l
    }

    /// One [`OpKind::Attention`] op.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        q: &'a [f32],
        k: &'a [f32],
        v: &'a [f32],
        heads: Heads,
        span: AttentionSpan,
        scale: f32,
        out: &'a mut [f32],
    ) -> Self {
        let mut l = HostList::new();
        let (q, k, v, o) = (l.input(q), l.input(k), l.input(v), l.output(out));
        l.op(
            OpKind::Attention,
            None,
            [Some(q), Some(k), Some(v)],
            o,
            attention_n(heads, span),
            scale,
        );
        l
    }

    /// One strided op (`Copy`, `Add` or `Mul`) from `src` into `dst`.
    pub fn strided(combine: Combine, src: &'a [f32], dst: &'a mut [f32], shape: Strided) -> Self {
        let mut l = HostList::new();
        let (s, d) = (l.input(src), l.in_out(dst));
        l.op(
            OpKind::from(combine),
            None,
            [Some(s), None, None],
            d,
            strided_n(shape),
            0.0,
        );
        l
    }
}

/// An op's `n` from its first values (the rest zero).
pub fn sizes(values: &[usize]) -> [u64; 8] {
    let mut n = [0u64; 8];
    for (d, &v) in n.iter_mut().zip(values) {
        *d = v as u64;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_lists_are_refused_with_a_reason() {
        let mut x = vec![0.0f32; 4];
        let mut l = HostList::new();
        let t = l.in_out(&mut x);
        l.op(OpKind::Gelu, None, [None; 3], t, [0; 8], 0.0);
        assert!(l.list().check().is_ok());
        l.op(OpKind::SiluMul, None, [Some(t), None, None], t, [0; 8], 0.0);
        assert!(l
            .list()
            .check()
            .unwrap_err()
            .contains("reads its own output"));

        let mut l = HostList::new();
        let t = l.scratch(4, false);
        l.op(OpKind::Gelu, None, [Some(7), None, None], t, [0; 8], 0.0);
        assert!(l.list().check().unwrap_err().contains("no tensor 7"));

        let mut l = HostList::new();
        let t = l.scratch(4, false);
        l.resident(t, 3);
        assert!(l
            .list()
            .check()
            .unwrap_err()
            .contains("without both host flags"));

        let mut x = vec![0.0f32; 4];
        let mut l = HostList::new();
        let t = l.input(&x);
        l.resident(t, 3);
        assert!(l
            .list()
            .check()
            .unwrap_err()
            .contains("without both host flags"));
        let mut l = HostList::new();
        let t = l.in_out(&mut x);
        l.resident(t, 3);
        l.op(OpKind::Gelu, None, [None; 3], t, [0; 8], 0.0);
        assert!(l.list().check().is_ok());

        let mut l = HostList::new();
        let t = l.scratch(4, false);
        l.tensors[t as usize].flags = TensorRecord::HOST_OUT;
        assert!(l
            .list()
            .check()
            .unwrap_err()
            .contains("without host memory"));

        let mut l = HostList::new();
        l.op(OpKind::Gelu, None, [None; 3], 0, [0; 8], 0.0);
        assert!(l.list().check().unwrap_err().contains("no output"));
    }

    #[test]
    fn a_tensor_without_host_flags_is_an_intermediate_result_wherever_it_points() {
        let mut x = vec![1.0f32; 4];
        let mut t = TensorRecord::host(x.as_mut_ptr(), 4, 0);
        assert!(t.is_scratch(), "host memory alone names nothing");
        t.flags = TensorRecord::ZEROED;
        assert!(t.is_scratch());
        t.flags = TensorRecord::HOST_OUT;
        assert!(!t.is_scratch());
        assert!(TensorRecord::scratch(4, true).is_scratch());
    }

    #[test]
    fn operand_lengths_come_from_the_table() {
        let (a, mut y) = (vec![1.0f32; 6], vec![0.0f32; 6]);
        let l = HostList::in_place(OpKind::SiluMul, &mut y, &a, &[], [0; 3], 0.0);
        let list = l.list();
        assert_eq!(list.lens(&list.ops[0]), [6, 0, 0, 6]);
    }
}
