//! A stage's ops collected into one list before they run, so a device backend gets the whole stage at once
//! (one submission, intermediate results kept on the device, the recorded commands replayed for the next chunk)
//! instead of one submit-and-wait per op, and the CPU backend one hand-off to its worker threads instead of one
//! per op.
//!
//! Model code asks a [`Graph`] for tensors and ops. On a backend that takes [lists](kazeia_backend_abi::Capabilities::LISTS)
//! (the CPU backend, built in or as a plugin, and the devices) nothing runs until the graph is flushed: when a
//! result is read on the host ([`Graph::read`], [`Graph::take`]), at [`Graph::finish`], or when the memory held
//! by pending ops passes the backend's budget: [`FLUSH_BYTES`] on a device, [`HOST_FLUSH_BYTES`] where the
//! backend's memory is the host's (the CPU: a talker step stays one list, a decoder chunk is cut about every
//! op). A backend without lists gets each op as soon as it is made ([`Graph::with_deferral`] chooses either way
//! for tests and comparisons). A dropped tensor's memory goes at once when no op is pending, else when the
//! pending list has run.
//! Everything between the heavy ops (residual adds, per-channel scales, transposes, a convolution's carried
//! columns) is a strided op of the list too, so no host work splits a stage.
//!
//! Tensors are handles ([`Tensor`]) to the graph's own buffers, to constants borrowed from the model (norm
//! weights, Snake parameters), or to state borrowed from the caller and updated in place (a convolution's
//! carried columns, a key/value cache). A tensor is freed when its handle is dropped. Every op reads and writes
//! whole tensors; offsets and strides are op parameters. When a list runs, its tensors cross to the backend as a
//! table ([`kazeia_backend_abi::list`]) and ops name them by index: a tensor dropped before the list runs is an
//! intermediate result and gets no host memory at all (a device keeps it to itself), one still held comes back
//! to the host; a fresh tensor that an op only partly writes is marked to start as zeros where it lives.
//!
//! A backend's failure is kept, not raised: the graph runs nothing more, and the next [`Graph::read`],
//! [`Graph::take`] or [`Graph::finish`] returns it as [`Error::Backend`], so model code builds its ops without
//! checking each one and the caller decides what to do (the synthesizer moves the stage to the CPU). State
//! tensors may then hold partial updates: the caller discards or rebuilds them.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;

use kazeia_backend_abi::list::{sizes, List, OpRecord, TensorRecord, NO_TENSOR};
use kazeia_backend_abi::plugin::{attention_n, strided_n, strided_of, OpKind};
use kazeia_backend_abi::{AttentionSpan, Backend, Combine, Heads, Strided, View, Weight};

use crate::error::{Error, Result};

/// Pending memory (bytes of the graph's own live and dropped buffers) past which the graph runs what it has on a
/// device, so a long one-shot decode does not hold every intermediate result at once.
pub const FLUSH_BYTES: usize = 256 << 20;
/// The same for a backend whose memory is the host's ([`kazeia_backend_abi::Capabilities::DEVICE`] unset): a
/// stage of small ops (a talker step) stays one list, one of large ones (a decoder chunk) is cut about every op,
/// so host memory never holds more intermediate results than op by op would (their memory is freed when a list
/// ends, and a list's are allocated by the thread that runs it).
pub const HOST_FLUSH_BYTES: usize = 4 << 20;

/// A tensor of a [`Graph`]: a handle that frees the tensor's memory when dropped (at once when no op is pending;
/// else after the pending list runs, where it was an intermediate result without host memory).
#[derive(Debug)]
pub struct Tensor {
    id: usize,
    dropped: Rc<RefCell<Vec<usize>>>,
}

impl Drop for Tensor {
    fn drop(&mut self) {
        self.dropped.borrow_mut().push(self.id);
    }
}

enum Buffer<'m> {
    /// The graph's own host memory.
    Host(Vec<f32>),
    /// The graph's own tensor with no host memory yet (on a list-taking backend, until a list leaves it alive).
    Virtual,
    /// The caller's buffer, updated in place; the tensor is its first `len` values.
    State(&'m mut [f32]),
    Constant(&'m [f32]),
    Freed,
}

struct Entry<'m> {
    buffer: Buffer<'m>,
    len: usize,
    released: bool,
    /// No op has written it yet.
    fresh: bool,
    /// Must start as zeros where it lives (a fresh tensor whose first writer reads it or writes it in part).
    zeroed: bool,
    /// [`TensorRecord::resident`].
    resident: u64,
}

impl Entry<'_> {
    fn owned_bytes(&self) -> usize {
        match self.buffer {
            Buffer::Host(_) | Buffer::Virtual => self.len * 4,
            _ => 0,
        }
    }
}

/// An op whose operands are graph entries; turned into an [`OpRecord`] when the graph runs.
struct Pending {
    kind: OpKind,
    weight: *const c_void,
    inputs: [Option<usize>; 3],
    out: usize,
    n: [u64; 8],
    f: [f32; 2],
}

/// Ops on tensors, run as one list on a backend.
pub struct Graph<'m> {
    backend: &'m dyn Backend,
    entries: Vec<Entry<'m>>,
    /// Ids of handles dropped since the last look.
    dropped: Rc<RefCell<Vec<usize>>>,
    /// Released while ops were pending: freed at the next flush.
    dead: Vec<usize>,
    /// Constants by address and length, so a list carries each once.
    constants: HashMap<(usize, usize), usize>,
    ops: Vec<Pending>,
    pending_bytes: usize,
    flushes: usize,
    /// Hold ops back until a result is needed (the backend prefers lists).
    deferred: bool,
    /// [`FLUSH_BYTES`] or [`HOST_FLUSH_BYTES`], smaller in tests.
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
            entries: Vec::new(),
            dropped: Rc::new(RefCell::new(Vec::new())),
            dead: Vec::new(),
            constants: HashMap::new(),
            ops: Vec::new(),
            pending_bytes: 0,
            flushes: 0,
            deferred,
            flush_bytes: if backend.capabilities().device() {
                FLUSH_BYTES
            } else {
                HOST_FLUSH_BYTES
            },
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

    fn push(&mut self, buffer: Buffer<'m>, len: usize) -> Tensor {
        let entry = Entry {
            buffer,
            len,
            released: false,
            fresh: false,
            zeroed: false,
            resident: 0,
        };
        self.pending_bytes += entry.owned_bytes();
        self.entries.push(entry);
        self.handle(self.entries.len() - 1)
    }

    fn handle(&self, id: usize) -> Tensor {
        Tensor {
            id,
            dropped: self.dropped.clone(),
        }
    }

    /// Host data as a new tensor.
    pub fn input(&mut self, data: Vec<f32>) -> Tensor {
        let len = data.len();
        self.push(Buffer::Host(data), len)
    }

    /// A new tensor of `len` zeros (on a list-taking backend, with no host memory until a result is read).
    pub fn zeros(&mut self, len: usize) -> Tensor {
        let buffer = if self.deferred {
            Buffer::Virtual
        } else {
            Buffer::Host(vec![0.0; len])
        };
        let t = self.push(buffer, len);
        self.entries[t.id].fresh = true;
        t
    }

    /// Model data that ops read (never written); the same data given twice is one tensor of the list.
    pub fn constant(&mut self, data: &'m [f32]) -> Tensor {
        let key = (data.as_ptr() as usize, data.len());
        if let Some(&id) = self.constants.get(&key) {
            return self.handle(id);
        }
        let t = self.push(Buffer::Constant(data), data.len());
        self.constants.insert(key, t.id);
        t
    }

    /// The caller's buffer, read and updated in place by the ops (after the graph has run).
    pub fn state(&mut self, data: &'m mut [f32]) -> Tensor {
        let len = data.len();
        self.push(Buffer::State(data), len)
    }

    /// The first `len` values of the caller's `buffer` as a state tensor that a list-taking backend may keep
    /// between graphs under `id` ([`TensorRecord::resident`]: a key/value cache, whose rows ops append to). Under
    /// `id`, the buffer must change only through ops of this backend's graphs: whoever writes it otherwise takes
    /// a new id, or a device computes on stale values.
    pub fn resident_state(&mut self, buffer: &'m mut [f32], len: usize, id: u64) -> Tensor {
        assert!(len <= buffer.len(), "a resident state past its buffer");
        let t = self.push(Buffer::State(buffer), len);
        self.entries[t.id].resident = id;
        t
    }

    pub fn len(&self, t: &Tensor) -> usize {
        self.entries[t.id].len
    }

    /// Marks the tensors whose handles were dropped as released: freed at once when nothing is pending, else
    /// after the next flush.
    fn collect_dropped(&mut self) {
        let dropped = std::mem::take(&mut *self.dropped.borrow_mut());
        for id in dropped {
            let entry = &mut self.entries[id];
            if entry.released || matches!(entry.buffer, Buffer::Constant(_)) {
                continue;
            }
            entry.released = true;
            if self.ops.is_empty() {
                self.free(id);
            } else {
                self.dead.push(id);
            }
        }
    }

    /// Drops an owned tensor's memory.
    fn free(&mut self, id: usize) {
        let entry = &mut self.entries[id];
        if matches!(entry.buffer, Buffer::Host(_) | Buffer::Virtual) {
            self.pending_bytes -= entry.owned_bytes();
            entry.buffer = Buffer::Freed;
        }
    }

    fn op(
        &mut self,
        kind: OpKind,
        weight: Option<&'m Weight>,
        inputs: [Option<&Tensor>; 3],
        out: &Tensor,
        n: [u64; 8],
        f: f32,
    ) {
        self.collect_dropped();
        assert!(
            !matches!(self.entries[out.id].buffer, Buffer::Constant(_)),
            "a {kind:?} op writes a constant"
        );
        for t in inputs.into_iter().flatten() {
            assert_ne!(t.id, out.id, "a {kind:?} op reads its own output");
        }
        let entry = &mut self.entries[out.id];
        if std::mem::take(&mut entry.fresh) && self.deferred {
            // The first op to write a fresh tensor: where it reads the old values or writes only part, the
            // tensor starts as zeros on the backend (set there, not uploaded).
            let whole = match kind.combine() {
                Some(Combine::Copy) => strided_of(n).is_some_and(|s| s.covers_dst(entry.len)),
                Some(_) => false,
                None => !kind.reads_output(),
            };
            entry.zeroed = !whole;
        }
        self.ops.push(Pending {
            kind,
            weight: weight.map_or(std::ptr::null(), |w| w as *const Weight as *const c_void),
            inputs: inputs.map(|t| t.map(|t| t.id)),
            out: out.id,
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
        x: &Tensor,
        n: [usize; 2],
        out_len: usize,
    ) -> Tensor {
        let y = self.zeros(out_len);
        self.op(kind, Some(w), [Some(x), None, None], &y, sizes(&n), 0.0);
        y
    }

    /// [`OpKind::Linear`] → `y[rows][out_features]`.
    pub fn linear(
        &mut self,
        w: &'m Weight,
        x: &Tensor,
        rows: usize,
        out_features: usize,
    ) -> Tensor {
        self.weighted(OpKind::Linear, w, x, [rows, 0], rows * out_features)
    }

    /// [`OpKind::Conv1d`] over `len` input columns → `out_len` values.
    pub fn conv1d(
        &mut self,
        w: &'m Weight,
        x: &Tensor,
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
        x: &Tensor,
        len: usize,
        out_len: usize,
    ) -> Tensor {
        self.weighted(OpKind::DepthwiseConv1d, w, x, [len, 0], out_len)
    }

    /// [`OpKind::ConvTranspose1d`] over `len` input columns → `out_len` values.
    pub fn conv_transpose1d(
        &mut self,
        w: &'m Weight,
        x: &Tensor,
        len: usize,
        out_len: usize,
    ) -> Tensor {
        self.weighted(OpKind::ConvTranspose1d, w, x, [len, 0], out_len)
    }

    /// [`OpKind::RmsNorm`], in place.
    pub fn rms_norm(&mut self, x: &Tensor, dim: usize, weight: &'m [f32], eps: f32) {
        let w = self.constant(weight);
        self.op(
            OpKind::RmsNorm,
            None,
            [Some(&w), None, None],
            x,
            sizes(&[dim]),
            eps,
        );
    }

    /// [`OpKind::LayerNorm`], in place.
    pub fn layer_norm(
        &mut self,
        x: &Tensor,
        dim: usize,
        weight: &'m [f32],
        bias: &'m [f32],
        eps: f32,
    ) {
        let (w, b) = (self.constant(weight), self.constant(bias));
        self.op(
            OpKind::LayerNorm,
            None,
            [Some(&w), Some(&b), None],
            x,
            sizes(&[dim]),
            eps,
        );
    }

    /// [`OpKind::Rope`], in place.
    pub fn rope(
        &mut self,
        x: &Tensor,
        heads: usize,
        head_dim: usize,
        start_pos: usize,
        theta: f32,
    ) {
        self.op(
            OpKind::Rope,
            None,
            [None, None, None],
            x,
            sizes(&[heads, head_dim, start_pos]),
            theta,
        );
    }

    /// [`OpKind::Attention`] → `out[queries][q_heads][head_dim]`.
    pub fn attention(
        &mut self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
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
            &out,
            n,
            scale,
        );
        out
    }

    /// [`OpKind::SnakeBeta`] on `x[channels][len]`, in place.
    pub fn snake_beta(&mut self, x: &Tensor, len: usize, alpha: &'m [f32], inv_beta: &'m [f32]) {
        let (a, b) = (self.constant(alpha), self.constant(inv_beta));
        self.op(
            OpKind::SnakeBeta,
            None,
            [Some(&a), Some(&b), None],
            x,
            sizes(&[len]),
            0.0,
        );
    }

    /// [`OpKind::Gelu`], in place.
    pub fn gelu(&mut self, x: &Tensor) {
        self.op(OpKind::Gelu, None, [None; 3], x, [0u64; 8], 0.0);
    }

    /// [`OpKind::Silu`], in place.
    pub fn silu(&mut self, x: &Tensor) {
        self.op(OpKind::Silu, None, [None; 3], x, [0u64; 8], 0.0);
    }

    /// [`OpKind::SiluMul`]: `gate = silu(gate) · up`, in place.
    pub fn silu_mul(&mut self, gate: &Tensor, up: &Tensor) {
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
    pub fn strided(&mut self, combine: Combine, src: &Tensor, dst: &Tensor, shape: Strided) {
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
    pub fn scale_columns(&mut self, x: &Tensor, rows: usize, scale: &'m [f32]) {
        let cols = scale.len();
        let scale = self.constant(scale);
        let shape = Strided {
            rows,
            cols,
            src: View::per_column(),
            dst: View::rows(0, cols),
        };
        self.strided(Combine::Mul, &scale, x, shape);
    }

    /// A copy of `x` (all of it) as a new tensor.
    pub fn duplicate(&mut self, x: &Tensor) -> Tensor {
        let len = self.len(x);
        let y = self.zeros(len);
        self.strided(Combine::Copy, x, &y, Strided::contiguous(len));
        y
    }

    /// Row `index` of `x[..][width]` as a new tensor.
    pub fn row(&mut self, x: &Tensor, index: usize, width: usize) -> Tensor {
        let y = self.zeros(width);
        let shape = Strided {
            rows: 1,
            cols: width,
            src: View::rows(index * width, width),
            dst: View::rows(0, width),
        };
        self.strided(Combine::Copy, x, &y, shape);
        y
    }

    /// `x[rows][cols]` → a new `[cols][rows]` tensor.
    pub fn transpose(&mut self, x: &Tensor, rows: usize, cols: usize) -> Tensor {
        let y = self.zeros(rows * cols);
        self.strided(Combine::Copy, x, &y, Strided::transpose(rows, cols));
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

    /// The table entry of graph entry `id` for the list being built: host memory where the host has values for
    /// it or will read it afterwards (an alive tensor with none yet gets it now), none for an intermediate
    /// result the list alone uses.
    fn tensor_record(entry: &mut Entry<'m>) -> TensorRecord {
        let alive = !entry.released;
        let zeroed = std::mem::take(&mut entry.zeroed);
        // Host memory, where there is some, holds the tensor's values: host data, or what an earlier list left.
        let had_values = !matches!(entry.buffer, Buffer::Virtual);
        if alive && matches!(entry.buffer, Buffer::Virtual) {
            // Read after the list: it comes back to host memory made now.
            entry.buffer = Buffer::Host(vec![0.0; entry.len]);
        }
        let mut flags = 0;
        if zeroed {
            flags |= TensorRecord::ZEROED;
        } else if had_values {
            flags |= TensorRecord::HOST_IN;
        }
        if alive {
            flags |= TensorRecord::HOST_OUT;
        }
        match &mut entry.buffer {
            Buffer::Virtual => TensorRecord::scratch(entry.len, zeroed),
            Buffer::Host(v) => TensorRecord::host(v.as_mut_ptr(), entry.len, flags),
            Buffer::State(s) => TensorRecord {
                len: entry.len,
                host: s.as_mut_ptr(),
                flags: TensorRecord::HOST_IN | TensorRecord::HOST_OUT,
                resident: entry.resident,
                capacity: s.len(),
            },
            Buffer::Constant(c) => {
                TensorRecord::host(c.as_ptr() as *mut f32, c.len(), TensorRecord::HOST_IN)
            }
            Buffer::Freed => unreachable!("a pending op uses a freed tensor"),
        }
    }

    /// Runs every pending op as one list, then frees the released buffers. After a failure nothing runs: the
    /// ops are dropped and the failure is returned again.
    pub fn flush(&mut self) -> Result<()> {
        self.collect_dropped();
        if self.failed.is_some() {
            self.ops.clear();
        }
        if !self.ops.is_empty() {
            // Graph entry → table index, in order of first use.
            let mut ids: Vec<usize> = Vec::new();
            let mut index: HashMap<usize, u32> = HashMap::new();
            let mut tensors: Vec<TensorRecord> = Vec::new();
            let mut records: Vec<OpRecord> = Vec::with_capacity(self.ops.len());
            let entries = &mut self.entries;
            let mut slot = |id: usize| -> u32 {
                // A list of a few ops (each op on the CPU) searches its few tensors; a stage uses a map.
                let known = if ids.len() <= 8 {
                    ids.iter().position(|&i| i == id).map(|i| i as u32)
                } else {
                    if index.is_empty() {
                        index.extend(ids.iter().enumerate().map(|(t, &i)| (i, t as u32)));
                    }
                    index.get(&id).copied()
                };
                known.unwrap_or_else(|| {
                    tensors.push(Self::tensor_record(&mut entries[id]));
                    ids.push(id);
                    if !index.is_empty() {
                        index.insert(id, (tensors.len() - 1) as u32);
                    }
                    (tensors.len() - 1) as u32
                })
            };
            for op in self.ops.drain(..) {
                let mut r = OpRecord::new(op.kind);
                r.weight = op.weight;
                r.inputs = op.inputs.map(|t| t.map_or(NO_TENSOR, &mut slot));
                r.out = slot(op.out);
                r.n = op.n;
                r.f = op.f;
                records.push(r);
            }
            let list = List {
                tensors: &tensors,
                ops: &records,
            };
            // SAFETY: every host pointer is a buffer this graph holds (owned, or borrowed for 'm) valid for its
            // capacity and not touched elsewhere while the list runs; distinct tensors are distinct buffers (a
            // state or constant is the caller's, owned buffers are the graph's); weights are borrowed for 'm; no
            // op reads its own output (checked in `op`).
            let result = unsafe { self.backend.run_list(list) };
            self.flushes += 1;
            if let Err(e) = result {
                self.failed = Some(e);
            }
        }
        for id in std::mem::take(&mut self.dead) {
            self.free(id);
        }
        self.check()
    }

    /// `t`'s values, after running what is pending.
    pub fn read(&mut self, t: &Tensor) -> Result<&[f32]> {
        self.flush()?;
        let entry = &mut self.entries[t.id];
        if matches!(entry.buffer, Buffer::Virtual) {
            // Never written: its zeros.
            entry.buffer = Buffer::Host(vec![0.0; entry.len]);
        }
        Ok(match &entry.buffer {
            Buffer::Host(v) => v,
            Buffer::State(s) => &s[..entry.len],
            Buffer::Constant(c) => c,
            Buffer::Virtual | Buffer::Freed => unreachable!("a live tensor without memory"),
        })
    }

    /// A graph-owned tensor's values, moved out after running what is pending.
    pub fn take(&mut self, t: Tensor) -> Result<Vec<f32>> {
        self.flush()?;
        let entry = &mut self.entries[t.id];
        entry.released = true;
        let bytes = entry.owned_bytes();
        let len = entry.len;
        match std::mem::replace(&mut entry.buffer, Buffer::Freed) {
            Buffer::Host(v) => {
                self.pending_bytes -= bytes;
                Ok(v)
            }
            Buffer::Virtual => {
                self.pending_bytes -= bytes;
                Ok(vec![0.0; len])
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

    /// The CPU backend, and the tables of the lists it was handed.
    struct Recording {
        cpu: CpuBackend,
        lists: std::sync::Mutex<Vec<Vec<TensorRecord>>>,
    }

    // SAFETY: the recorded tables are only compared field by field; their pointers are never read.
    unsafe impl Send for Recording {}
    // SAFETY: as for `Send`.
    unsafe impl Sync for Recording {}

    impl Backend for Recording {
        fn name(&self) -> &str {
            "recording"
        }
        fn upload(
            &self,
            w: kazeia_backend_abi::WeightData<'_>,
        ) -> std::result::Result<Weight, String> {
            self.cpu.upload(w)
        }
        unsafe fn run_list(&self, list: List<'_>) -> std::result::Result<(), String> {
            self.lists.lock().unwrap().push(list.tensors.to_vec());
            // SAFETY: forwarded under the same contract.
            unsafe { self.cpu.run_list(list) }
        }
    }

    fn recording() -> Recording {
        Recording {
            cpu: CpuBackend::new(1),
            lists: Default::default(),
        }
    }

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
        let y = g.linear(&w, &x, 2, 2);
        g.strided(
            Combine::Add,
            &s,
            &y,
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
            &y,
            &s,
            Strided {
                rows: 1,
                cols: 2,
                src: View::rows(2, 2),
                dst: View::rows(0, 2),
            },
        );
        assert_eq!(g.flushes(), 0);
        assert_eq!(g.read(&y).unwrap(), [13.5, 26.5, 12.5, 25.5]);
        assert_eq!(g.flushes(), 1);
        let t = g.transpose(&y, 2, 2);
        assert_eq!(g.take(t).unwrap(), [13.5, 12.5, 26.5, 25.5]);
        g.finish().unwrap();
        assert_eq!(state, [12.5, 25.5]);
    }

    #[test]
    fn without_deferral_each_op_runs_at_once_and_dropped_memory_goes() {
        let backend = CpuBackend::new(1);
        let mut g = Graph::with_deferral(&backend, false);
        let x = g.input(vec![1.0, -2.0]);
        let y = g.duplicate(&x);
        assert_eq!(g.flushes(), 1);
        drop(x);
        g.gelu(&y);
        assert_eq!(g.flushes(), 2);
        assert_eq!(g.pending_bytes, 8);
        assert_eq!(g.take(y).unwrap()[0], 0.841_344_7);
    }

    #[test]
    fn intermediate_results_cross_without_host_memory_and_what_is_held_comes_back() {
        let backend = recording();
        let mut g = Graph::with_deferral(&backend, true);
        let x = g.input(vec![1.0, -2.0, 3.0]);
        let kept = g.duplicate(&x);
        let dead = g.duplicate(&x);
        g.gelu(&dead);
        g.strided(Combine::Add, &dead, &kept, Strided::contiguous(3));
        drop(dead);
        assert_eq!(g.read(&kept).unwrap()[2], 3.0 + 2.995_950_3);
        let lists = backend.lists.lock().unwrap();
        let table = &lists[0];
        assert_eq!(table.len(), 3, "x, kept, dead");
        assert!(
            table[0].host_in() && table[0].host_out(),
            "x: an input, still held"
        );
        assert!(!table[1].is_scratch() && table[1].host_out() && !table[1].host_in());
        assert!(
            !table[1].zeroed(),
            "written whole by its first op: nothing to set"
        );
        assert!(
            table[2].is_scratch(),
            "dropped before the list ran: no host memory"
        );
        assert_eq!(g.pending_bytes, 24, "x and kept");
    }

    #[test]
    fn a_fresh_tensor_written_in_part_starts_as_zeros_where_it_lives() {
        let backend = recording();
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
        g.strided(Combine::Copy, &x, &fresh, part);
        g.strided(Combine::Add, &x, &z, part);
        assert_eq!(g.read(&fresh).unwrap(), [0.0, 0.0, 7.0, 8.0, 9.0, 0.0]);
        assert_eq!(g.read(&z).unwrap(), [5.0, 5.0, 12.0, 13.0, 14.0, 5.0]);
        let lists = backend.lists.lock().unwrap();
        let zeroed: Vec<bool> = lists[0].iter().map(TensorRecord::zeroed).collect();
        assert_eq!(zeroed, [false, true, false], "x, fresh, z");
    }

    #[test]
    fn a_constant_given_twice_is_one_tensor_of_the_list() {
        let backend = recording();
        let norm = vec![1.0f32; 2];
        let mut g = Graph::with_deferral(&backend, true);
        let x = g.input(vec![3.0, 4.0]);
        g.rms_norm(&x, 2, &norm, 1e-6);
        g.rms_norm(&x, 2, &norm, 1e-6);
        g.read(&x).unwrap();
        assert_eq!(backend.lists.lock().unwrap()[0].len(), 2);
    }

    #[test]
    fn a_deferred_graph_runs_what_it_has_when_its_memory_passes_the_budget() {
        // A long one-shot decode: dropped intermediate results are freed at each forced flush.
        let backend = CpuBackend::new(1);
        let mut g = Graph::with_deferral(&backend, true);
        g.flush_bytes = 4 * 1024;
        let mut x = g.input(vec![1.0; 256]);
        for _ in 0..10 {
            let y = g.duplicate(&x);
            g.gelu(&y);
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
        g.silu_mul(&x, &x);
    }
}
