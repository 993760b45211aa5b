//! A stage's ops collected into one list before they run, so a device backend gets the whole stage at once
//! (one submission, intermediate results kept on the device, the recorded commands replayed for the next chunk)
//! instead of one submit-and-wait per op.
//!
//! Model code asks a [`Graph`] for tensors and ops. On a backend that takes [lists](kazeia_backend_abi::Capabilities::LISTS)
//! nothing runs until the graph is flushed: when a result is read on the host ([`Graph::read`], [`Graph::take`]),
//! at [`Graph::finish`], or when the memory held by pending ops passes [`FLUSH_BYTES`]. On the others (the CPU)
//! each op runs as soon as it is made and a released tensor's memory goes at once, as plain calls would.
//! Everything between the heavy ops (residual adds, per-channel scales, transposes, a convolution's carried
//! columns) is a strided op of the list too, so no host work splits a stage.
//!
//! Tensors are the graph's own buffers, constants borrowed from the model (norm weights, Snake parameters), or
//! state borrowed from the caller and updated in place (a convolution's carried columns, a key/value window).
//! Every op reads and writes whole tensors; offsets and strides are op parameters, so a device backend can match
//! one op's output with a later op's input by buffer.
//!
//! A backend's failure is kept, not raised: the graph runs nothing more, and the next [`Graph::read`],
//! [`Graph::take`] or [`Graph::finish`] returns it as [`Error::Backend`], so model code builds its ops without
//! checking each one and the caller decides what to do (the synthesizer moves the stage to the CPU). State
//! tensors may then hold partial updates: the caller discards or rebuilds them.

use std::ffi::c_void;

use kazeia_backend_abi::plugin::{attention_n, strided_n, strided_of, OpKind, OpRecord};
use kazeia_backend_abi::{AttentionSpan, Backend, Combine, Heads, Strided, View, Weight};

use crate::error::{Error, Result};

/// Pending memory (bytes of the graph's own live and released buffers) past which the graph runs what it has, so
/// a long one-shot decode does not hold every intermediate result at once.
pub const FLUSH_BYTES: usize = 256 << 20;

/// An op's `n` from its first values (the rest zero).
fn dims(values: &[usize]) -> [u64; 8] {
    let mut n = [0u64; 8];
    for (d, &v) in n.iter_mut().zip(values) {
        *d = v as u64;
    }
    n
}

/// A tensor of a [`Graph`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor(usize);

enum Buffer<'m> {
    Owned(Vec<f32>),
    State(&'m mut [f32]),
    Constant(&'m [f32]),
}

impl Buffer<'_> {
    fn len(&self) -> usize {
        match self {
            Buffer::Owned(v) => v.len(),
            Buffer::State(s) => s.len(),
            Buffer::Constant(c) => c.len(),
        }
    }
}

/// An op whose buffers are tensors; turned into an [`OpRecord`] when the graph runs.
struct Pending {
    kind: OpKind,
    weight: *const c_void,
    inputs: [Option<Tensor>; 3],
    out: Tensor,
    n: [u64; 8],
    f: [f32; 2],
}

/// Ops on tensors, run as one list on a backend.
pub struct Graph<'m> {
    backend: &'m dyn Backend,
    buffers: Vec<Buffer<'m>>,
    released: Vec<bool>,
    /// Released while ops were pending: freed (and discarded on a device) at the next flush.
    dead: Vec<Tensor>,
    /// Made by [`Graph::zeros`] and not yet written by an op.
    fresh: Vec<bool>,
    ops: Vec<Pending>,
    /// Hints sent at the head of the next list.
    hints: Vec<OpRecord>,
    pending_bytes: usize,
    flushes: usize,
    /// Hold ops back until a result is needed (the backend prefers lists).
    deferred: bool,
    /// [`FLUSH_BYTES`], smaller in tests.
    flush_bytes: usize,
    /// The backend's failure, once it failed: nothing runs after it.
    failed: Option<String>,
}

impl<'m> Graph<'m> {
    pub fn new(backend: &'m dyn Backend) -> Self {
        Self::with_deferral(backend, backend.capabilities().lists())
    }

    /// A graph that holds ops back until a result is needed (`deferred`) or runs each at once, whatever the
    /// backend prefers (tests, comparisons).
    pub fn with_deferral(backend: &'m dyn Backend, deferred: bool) -> Self {
        Graph {
            backend,
            buffers: Vec::new(),
            released: Vec::new(),
            dead: Vec::new(),
            fresh: Vec::new(),
            ops: Vec::new(),
            hints: Vec::new(),
            pending_bytes: 0,
            flushes: 0,
            deferred,
            flush_bytes: FLUSH_BYTES,
            failed: None,
        }
    }

    pub fn backend(&self) -> &'m dyn Backend {
        self.backend
    }

    /// Lists handed to the backend so far.
    pub fn flushes(&self) -> usize {
        self.flushes
    }

    fn push(&mut self, buffer: Buffer<'m>) -> Tensor {
        if let Buffer::Owned(v) = &buffer {
            self.pending_bytes += v.len() * 4;
        }
        self.buffers.push(buffer);
        self.released.push(false);
        self.fresh.push(false);
        Tensor(self.buffers.len() - 1)
    }

    /// Host data as a new tensor.
    pub fn input(&mut self, data: Vec<f32>) -> Tensor {
        self.push(Buffer::Owned(data))
    }

    /// A new tensor of `len` zeros.
    pub fn zeros(&mut self, len: usize) -> Tensor {
        let t = self.input(vec![0.0; len]);
        self.fresh[t.0] = true;
        t
    }

    /// Model data that ops read (never written).
    pub fn constant(&mut self, data: &'m [f32]) -> Tensor {
        self.push(Buffer::Constant(data))
    }

    /// The caller's buffer, read and updated in place by the ops (after the graph has run).
    pub fn state(&mut self, data: &'m mut [f32]) -> Tensor {
        self.push(Buffer::State(data))
    }

    pub fn len(&self, t: Tensor) -> usize {
        self.buffers[t.0].len()
    }

    /// No later op uses `t`: its memory goes at once when nothing is pending, else at the next flush.
    pub fn release(&mut self, t: Tensor) {
        self.released[t.0] = true;
        if self.ops.is_empty() {
            self.free(t);
        } else {
            self.dead.push(t);
        }
    }

    /// Drops an owned tensor's memory.
    fn free(&mut self, t: Tensor) {
        if let Buffer::Owned(v) = &mut self.buffers[t.0] {
            self.pending_bytes -= v.len() * 4;
            *v = Vec::new();
        }
    }

    fn live(&self, t: Tensor) -> Tensor {
        assert!(!self.released[t.0], "tensor {t:?} used after its release");
        t
    }

    fn op(
        &mut self,
        kind: OpKind,
        weight: Option<&'m Weight>,
        inputs: [Option<Tensor>; 3],
        out: Tensor,
        n: [u64; 8],
        f: f32,
    ) {
        let out = self.live(out);
        assert!(
            !matches!(self.buffers[out.0], Buffer::Constant(_)),
            "a {kind:?} op writes a constant"
        );
        for t in inputs.into_iter().flatten() {
            self.live(t);
            assert_ne!(t, out, "a {kind:?} op reads its own output");
        }
        if std::mem::take(&mut self.fresh[out.0]) && self.deferred && kind.combine().is_some() {
            // A strided op writes a fresh tensor, perhaps only in part: the zeros are set where the op runs
            // rather than copied there.
            let len = self.len(out);
            let covered = strided_of(n).is_some_and(|s| s.covers_dst(len));
            if !covered {
                self.ops.push(Pending {
                    kind: OpKind::Fill,
                    weight: std::ptr::null(),
                    inputs: [None; 3],
                    out,
                    n: [0; 8],
                    f: [0.0; 2],
                });
            }
        }
        self.ops.push(Pending {
            kind,
            weight: weight.map_or(std::ptr::null(), |w| w as *const Weight as *const c_void),
            inputs,
            out,
            n,
            f: [f, 0.0],
        });
        if !self.deferred || self.pending_bytes > self.flush_bytes {
            // A failure is kept for the next read (see the module comment).
            let _ = self.flush();
        }
    }

    fn weighted(
        &mut self,
        kind: OpKind,
        w: &'m Weight,
        x: Tensor,
        n: [usize; 2],
        out_len: usize,
    ) -> Tensor {
        let y = self.zeros(out_len);
        self.op(kind, Some(w), [Some(x), None, None], y, dims(&n), 0.0);
        y
    }

    /// [`OpKind::Linear`] → `y[rows][out_features]`.
    pub fn linear(&mut self, w: &'m Weight, x: Tensor, rows: usize, out_features: usize) -> Tensor {
        self.weighted(OpKind::Linear, w, x, [rows, 0], rows * out_features)
    }

    /// [`OpKind::Conv1d`] over `len` input columns → `out_len` values.
    pub fn conv1d(
        &mut self,
        w: &'m Weight,
        x: Tensor,
        len: usize,
        dilation: usize,
        out_len: usize,
    ) -> Tensor {
        self.weighted(OpKind::Conv1d, w, x, [len, dilation], out_len)
    }

    /// [`OpKind::DepthwiseConv1d`] over `len` input columns → `out_len` values.
    pub fn depthwise_conv1d(
        &mut self,
        w: &'m Weight,
        x: Tensor,
        len: usize,
        out_len: usize,
    ) -> Tensor {
        self.weighted(OpKind::DepthwiseConv1d, w, x, [len, 0], out_len)
    }

    /// [`OpKind::ConvTranspose1d`] over `len` input columns → `out_len` values.
    pub fn conv_transpose1d(
        &mut self,
        w: &'m Weight,
        x: Tensor,
        len: usize,
        out_len: usize,
    ) -> Tensor {
        self.weighted(OpKind::ConvTranspose1d, w, x, [len, 0], out_len)
    }

    /// [`OpKind::RmsNorm`], in place.
    pub fn rms_norm(&mut self, x: Tensor, dim: usize, weight: &'m [f32], eps: f32) {
        let w = self.constant(weight);
        self.op(
            OpKind::RmsNorm,
            None,
            [Some(w), None, None],
            x,
            dims(&[dim]),
            eps,
        );
    }

    /// [`OpKind::LayerNorm`], in place.
    pub fn layer_norm(
        &mut self,
        x: Tensor,
        dim: usize,
        weight: &'m [f32],
        bias: &'m [f32],
        eps: f32,
    ) {
        let (w, b) = (self.constant(weight), self.constant(bias));
        self.op(
            OpKind::LayerNorm,
            None,
            [Some(w), Some(b), None],
            x,
            dims(&[dim]),
            eps,
        );
    }

    /// [`OpKind::Rope`], in place.
    pub fn rope(&mut self, x: Tensor, heads: usize, head_dim: usize, start_pos: usize, theta: f32) {
        self.op(
            OpKind::Rope,
            None,
            [None, None, None],
            x,
            dims(&[heads, head_dim, start_pos]),
            theta,
        );
    }

    /// [`OpKind::Attention`] → `out[queries][q_heads][head_dim]`.
    pub fn attention(
        &mut self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        heads: Heads,
        span: AttentionSpan,
        scale: f32,
    ) -> Tensor {
        let out = self.zeros(self.len(q));
        let n = attention_n(heads, span);
        self.op(
            OpKind::Attention,
            None,
            [Some(q), Some(k), Some(v)],
            out,
            n,
            scale,
        );
        out
    }

    /// [`OpKind::SnakeBeta`] on `x[channels][len]`, in place.
    pub fn snake_beta(&mut self, x: Tensor, len: usize, alpha: &'m [f32], inv_beta: &'m [f32]) {
        let (a, b) = (self.constant(alpha), self.constant(inv_beta));
        self.op(
            OpKind::SnakeBeta,
            None,
            [Some(a), Some(b), None],
            x,
            dims(&[len]),
            0.0,
        );
    }

    /// [`OpKind::Gelu`], in place.
    pub fn gelu(&mut self, x: Tensor) {
        self.op(OpKind::Gelu, None, [None; 3], x, [0u64; 8], 0.0);
    }

    /// [`OpKind::Silu`], in place.
    pub fn silu(&mut self, x: Tensor) {
        self.op(OpKind::Silu, None, [None; 3], x, [0u64; 8], 0.0);
    }

    /// [`OpKind::SiluMul`]: `gate = silu(gate) · up`, in place.
    pub fn silu_mul(&mut self, gate: Tensor, up: Tensor) {
        self.op(
            OpKind::SiluMul,
            None,
            [Some(up), None, None],
            gate,
            [0u64; 8],
            0.0,
        );
    }

    /// a strided op ([`OpKind::Copy`], [`OpKind::Add`], [`OpKind::Mul`]): `dst[view] (=, +=, ×=) src[view]`.
    pub fn strided(&mut self, combine: Combine, src: Tensor, dst: Tensor, shape: Strided) {
        if let Err(e) = shape.check(self.len(src), self.len(dst)) {
            panic!("{e}");
        }
        if shape.is_empty() {
            return;
        }
        let n = strided_n(shape);
        self.op(
            OpKind::from(combine),
            None,
            [Some(src), None, None],
            dst,
            n,
            0.0,
        );
    }

    /// `x[r][c] *= scale[c]` on `x[rows][scale.len()]`, in place (LayerScale, ConvNeXt's γ).
    pub fn scale_columns(&mut self, x: Tensor, rows: usize, scale: &'m [f32]) {
        let cols = scale.len();
        let scale = self.constant(scale);
        let shape = Strided {
            rows,
            cols,
            src: View::per_column(),
            dst: View::rows(0, cols),
        };
        self.strided(Combine::Mul, scale, x, shape);
    }

    /// A copy of `x` (all of it) as a new tensor.
    pub fn duplicate(&mut self, x: Tensor) -> Tensor {
        let len = self.len(x);
        let y = self.zeros(len);
        self.strided(Combine::Copy, x, y, Strided::contiguous(len));
        y
    }

    /// Row `index` of `x[..][width]` as a new tensor.
    pub fn row(&mut self, x: Tensor, index: usize, width: usize) -> Tensor {
        let y = self.zeros(width);
        let shape = Strided {
            rows: 1,
            cols: width,
            src: View::rows(index * width, width),
            dst: View::rows(0, width),
        };
        self.strided(Combine::Copy, x, y, shape);
        y
    }

    /// `x[rows][cols]` → a new `[cols][rows]` tensor.
    pub fn transpose(&mut self, x: Tensor, rows: usize, cols: usize) -> Tensor {
        let y = self.zeros(rows * cols);
        self.strided(Combine::Copy, x, y, Strided::transpose(rows, cols));
        y
    }

    /// The backend's failure as an error, if it failed.
    fn check(&self) -> Result<()> {
        match &self.failed {
            Some(message) => Err(Error::Backend {
                backend: self.backend.name().to_owned(),
                message: message.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Runs every pending op as one list, then frees the released buffers. After a failure nothing runs: the
    /// ops are dropped and the failure is returned again.
    pub fn flush(&mut self) -> Result<()> {
        if self.failed.is_some() {
            self.hints.clear();
            self.ops.clear();
        }
        if !self.ops.is_empty() {
            let Graph {
                buffers,
                ops,
                hints,
                dead,
                ..
            } = self;
            let mut place = |t: Tensor| match &mut buffers[t.0] {
                Buffer::Owned(v) => (v.as_mut_ptr(), v.len()),
                Buffer::State(s) => (s.as_mut_ptr(), s.len()),
                Buffer::Constant(c) => (c.as_ptr() as *mut f32, c.len()),
            };
            let mut records: Vec<OpRecord> = std::mem::take(hints);
            for op in ops.drain(..) {
                let mut r = OpRecord::new(op.kind);
                r.weight = op.weight;
                let mut input = |t: Option<Tensor>| {
                    t.map_or((std::ptr::null(), 0), |t| {
                        let (p, len) = place(t);
                        (p as *const f32, len)
                    })
                };
                (r.a, r.a_len) = input(op.inputs[0]);
                (r.b, r.b_len) = input(op.inputs[1]);
                (r.c, r.c_len) = input(op.inputs[2]);
                (r.out, r.out_len) = place(op.out);
                r.n = op.n;
                r.f = op.f;
                records.push(r);
            }
            // Dead intermediate results need not come back from a device.
            for &t in dead.iter() {
                let (p, len) = place(t);
                if len > 0 {
                    let mut r = OpRecord::new(OpKind::Discard);
                    (r.a, r.a_len) = (p as *const f32, len);
                    records.push(r);
                }
            }
            // SAFETY: every record points into a buffer this graph holds (owned, or borrowed for 'm) with its
            // length, or a resident buffer its caller keeps allocated (`resident`'s contract); weights are
            // borrowed for 'm; no op's output is one of its inputs (checked in `op`).
            let result = unsafe { self.backend.run_records(&records) };
            self.flushes += 1;
            if let Err(e) = result {
                self.failed = Some(e);
            }
        }
        for t in std::mem::take(&mut self.dead) {
            self.free(t);
        }
        self.check()
    }

    /// Tells a list-taking backend that `len` values at `buffer` (a whole KV cache, say, whose rows ops append to)
    /// may stay on its device under `id` ([`OpKind::Resident`]).
    ///
    /// # Safety
    /// The buffer must stay allocated until this graph has run, and under `id` its contents must change only
    /// through ops of this backend's lists.
    pub unsafe fn resident(&mut self, buffer: *const f32, len: usize, id: u64) {
        if self.deferred {
            let mut r = OpRecord::new(OpKind::Resident);
            (r.a, r.a_len) = (buffer, len);
            r.n[0] = id;
            self.hints.push(r);
        }
    }

    /// `t`'s values, after running what is pending.
    pub fn read(&mut self, t: Tensor) -> Result<&[f32]> {
        self.flush()?;
        Ok(match &self.buffers[self.live(t).0] {
            Buffer::Owned(v) => v,
            Buffer::State(s) => s,
            Buffer::Constant(c) => c,
        })
    }

    /// A graph-owned tensor's values, moved out after running what is pending (the tensor is released).
    pub fn take(&mut self, t: Tensor) -> Result<Vec<f32>> {
        self.flush()?;
        let t = self.live(t);
        self.released[t.0] = true;
        match &mut self.buffers[t.0] {
            Buffer::Owned(v) => {
                self.pending_bytes -= v.len() * 4;
                Ok(std::mem::take(v))
            }
            _ => panic!("only a graph's own tensors can be taken"),
        }
    }

    /// Runs what is pending; state tensors hold their new values afterwards.
    pub fn finish(mut self) -> Result<()> {
        self.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpuBackend;

    #[test]
    fn ops_run_only_when_a_result_is_needed_and_state_is_updated_in_place() {
        let backend = CpuBackend::new(1);
        let w = backend.upload_linear(
            &[1.0, 2.0, 3.0, 4.0],
            2,
            2,
            Some(&[0.5, -0.5]),
            Default::default(),
        );
        let mut state = vec![10.0, 20.0];
        let mut g = Graph::with_deferral(&backend, true);
        let x = g.input(vec![1.0, 1.0, 2.0, 0.0]);
        let s = g.state(&mut state);
        let y = g.linear(&w, x, 2, 2);
        g.strided(
            Combine::Add,
            s,
            y,
            Strided {
                rows: 2,
                cols: 2,
                src: View {
                    offset: 0,
                    row_stride: 0,
                    col_stride: 1,
                },
                dst: View::rows(0, 2),
            },
        );
        g.strided(
            Combine::Copy,
            y,
            s,
            Strided {
                rows: 1,
                cols: 2,
                src: View::rows(2, 2),
                dst: View::rows(0, 2),
            },
        );
        assert_eq!(g.flushes(), 0);
        assert_eq!(g.read(y).unwrap(), [13.5, 26.5, 12.5, 25.5]);
        assert_eq!(g.flushes(), 1);
        let t = g.transpose(y, 2, 2);
        assert_eq!(g.take(t).unwrap(), [13.5, 12.5, 26.5, 25.5]);
        g.finish().unwrap();
        assert_eq!(state, [12.5, 25.5]);
    }

    #[test]
    fn without_deferral_each_op_runs_at_once_and_released_memory_goes() {
        let backend = CpuBackend::new(1);
        let mut g = Graph::new(&backend);
        let x = g.input(vec![1.0, -2.0]);
        let y = g.duplicate(x);
        assert_eq!(g.flushes(), 1);
        g.release(x);
        assert_eq!(g.pending_bytes, 8);
        g.gelu(y);
        assert_eq!(g.flushes(), 2);
        assert_eq!(g.take(y).unwrap()[0], 0.841_344_7);
    }

    #[test]
    fn a_fresh_tensor_written_in_part_keeps_its_zeros_elsewhere() {
        // Deferred, the graph sets such a tensor with a Fill op (a device then fills it instead of uploading).
        let backend = CpuBackend::new(1);
        let mut g = Graph::with_deferral(&backend, true);
        let x = g.input(vec![7.0, 8.0, 9.0]);
        let z = g.input(vec![5.0; 6]);
        let fresh = g.zeros(6);
        let part = Strided {
            rows: 1,
            cols: 3,
            src: View::rows(0, 3),
            dst: View::rows(2, 3),
        };
        g.strided(Combine::Copy, x, fresh, part);
        g.strided(Combine::Add, x, z, part);
        assert_eq!(g.ops.iter().filter(|o| o.kind == OpKind::Fill).count(), 1);
        assert_eq!(g.read(fresh).unwrap(), [0.0, 0.0, 7.0, 8.0, 9.0, 0.0]);
        assert_eq!(g.read(z).unwrap(), [5.0, 5.0, 12.0, 13.0, 14.0, 5.0]);
    }

    #[test]
    fn a_deferred_graph_runs_what_it_has_when_its_memory_passes_the_budget() {
        // A long one-shot decode: released intermediate results are freed at each forced flush.
        let backend = CpuBackend::new(1);
        let mut g = Graph::with_deferral(&backend, true);
        g.flush_bytes = 4 * 1024;
        let mut x = g.input(vec![1.0; 256]);
        for _ in 0..10 {
            let y = g.duplicate(x);
            g.gelu(y);
            g.release(x);
            x = y;
        }
        assert!(g.flushes() >= 2, "{} flushes", g.flushes());
        assert!(
            g.pending_bytes <= 2 * 4 * 1024,
            "{} bytes held",
            g.pending_bytes
        );
        let mut want = [1.0f32];
        for _ in 0..10 {
            backend.gelu(&mut want);
        }
        assert_eq!(g.take(x).unwrap()[0], want[0]);
    }

    #[test]
    #[should_panic(expected = "reads its own output")]
    fn an_op_reading_its_own_output_is_refused() {
        let backend = CpuBackend::new(1);
        let mut g = Graph::new(&backend);
        let x = g.zeros(4);
        g.silu_mul(x, x);
    }

    #[test]
    #[should_panic(expected = "used after its release")]
    fn a_released_tensor_cannot_be_used() {
        let backend = CpuBackend::new(1);
        let mut g = Graph::new(&backend);
        let x = g.zeros(4);
        g.release(x);
        g.gelu(x);
    }
}
