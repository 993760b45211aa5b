//! The `Backend` on a compute-DSP session: Q8_0/Q4_0 linear layers of a few rows (the talker's and code
//! predictor's token steps) run as HVX matvec ops submitted through the op queue; the decoder's convolutions and
//! transposed convolutions (one product per output phase) run as im2col fp16 tile products on HMX where the DSP
//! build has it (the first one the DSP refuses as unsupported sends every later one to the CPU); every other op
//! runs on the CPU backend inside the plugin, so a stage can always be given to `hexagon` whole.
//!
//! Device-only: without a DSP `new` fails with the probe's reason (the engine then uses the CPU). The DSP path
//! is untested until a device runs the README's runbook.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

use kazeia_backend_abi::list::{List, OpRecord, NO_TENSOR};
use kazeia_backend_abi::plugin::OpKind;
use kazeia_backend_abi::{Backend, Weight, WeightData, WeightFormat};
use kazeia_backend_cpu::CpuBackend;

use crate::fastrpc::{RunError, Session, SharedBuffer, STATUS_UNSUPPORTED};
use crate::probe::dsp;
use crate::queue::{encode, Arena, QueueKind, QueueOp, Slice};
use crate::reference::quantize_activations;
use crate::repack::{
    conv_transpose_phase_tiles, conv_weight_tiles, pad_columns, scatter_phase, to_hvx, QuantRows,
    MAX_GROUP,
};

/// Rows up to which a linear layer runs as matvecs on the DSP (above: a prefill, left to the CPU's GEMM; the fp16
/// tile product could take it, not wired yet).
pub const DSP_MAX_ROWS: usize = 4;

/// A conv1d weight resident in shared memory as fp16 im2col tiles (`[cout][k·cin]`), with the CPU's copy.
struct DspConv {
    cpu: Weight,
    shared: SharedBuffer,
    tiles: Slice,
    cout: usize,
    cin: usize,
    k: usize,
    bias: Vec<f32>,
}

/// A transposed conv weight resident in shared memory as one set of fp16 im2col tiles per output phase
/// (`repack::conv_transpose_phase_tiles`), with the CPU's copy.
struct DspConvTranspose {
    cpu: Weight,
    shared: SharedBuffer,
    phases: Vec<Slice>,
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
}

/// What the DSP said about the fp16 tile product.
const HMX_UNKNOWN: u8 = 0;
const HMX_YES: u8 = 1;
const HMX_NO: u8 = 2;

/// A Q8_0/Q4_0 linear weight resident in shared memory in the HVX layout, with the CPU's copy for the rest.
struct DspLinear {
    cpu: Weight,
    shared: SharedBuffer,
    quants: Slice,
    scales: Slice,
    rows: QuantRows,
}

pub struct HexagonBackend {
    cpu: CpuBackend,
    session: Session,
    /// One queue in flight at a time.
    submit: Mutex<()>,
    /// `HMX_*`: whether convolutions go to the DSP.
    hmx: AtomicU8,
}

impl HexagonBackend {
    pub fn new(threads: usize) -> Result<HexagonBackend, String> {
        let dsp = dsp().map_err(str::to_string)?;
        Ok(HexagonBackend {
            cpu: CpuBackend::new(threads),
            session: Session::open(dsp.api)?,
            submit: Mutex::new(()),
            hmx: AtomicU8::new(HMX_UNKNOWN),
        })
    }

    fn upload_dsp_conv(
        &self,
        w: &[f32],
        (cout, cin, k): (usize, usize, usize),
        bias: Option<&[f32]>,
    ) -> Result<DspConv, String> {
        let tiles = conv_weight_tiles(w, cout, cin, k);
        let mut arena = Arena::default();
        let slice = arena.push(&u16_bytes(&tiles.data));
        let mut shared = self.session.alloc(arena.bytes.len())?;
        shared.bytes_mut().copy_from_slice(&arena.bytes);
        Ok(DspConv {
            cpu: self.cpu.upload_conv1d(w, cout, cin, k, bias),
            shared,
            tiles: Slice { buffer: 1, ..slice },
            cout,
            cin,
            k,
            bias: bias.map_or_else(|| vec![0.0; cout], <[f32]>::to_vec),
        })
    }

    /// The convolution products `im2col(x)[lout][k·cin] · wᵀ` for each weight `w[n][k·cin]` in `weights` (tiles
    /// in shared memory), as one queue: the DSP builds the fp16 im2col tiles of `x[cin][len]` once (`Im2colF16`),
    /// then runs each product on them. Each result is `[lout][n]` row-major.
    fn conv_products(
        &self,
        x: &[f32],
        (cin, len, k, dilation): (usize, usize, usize, usize),
        shared: &SharedBuffer,
        weights: &[(Slice, usize)],
    ) -> Result<Vec<Vec<f32>>, RunError> {
        let lout = len - (k - 1) * dilation;
        let inner = k * cin;
        let tile_bytes = lout.div_ceil(32) * inner.div_ceil(32) * 32 * 32 * 2;
        let mut arena = Arena::default();
        let xs = arena.push(&f32_bytes(x));
        let tiles = arena.reserve(tile_bytes);
        let mut ops = vec![QueueOp {
            kind: QueueKind::Im2colF16,
            format: 0,
            args: [
                xs,
                tiles,
                Slice::default(),
                Slice::default(),
                Slice::default(),
            ],
            dims: [cin as u32, len as u32, k as u32, dilation as u32, 0],
        }];
        let mut outputs = Vec::with_capacity(weights.len());
        for &(w, n) in weights {
            let out = arena.reserve(lout * n * 4);
            outputs.push(out);
            ops.push(QueueOp {
                kind: QueueKind::MatmulF16Tiles,
                format: 0,
                args: [tiles, w, out, Slice::default(), Slice::default()],
                dims: [lout as u32, n as u32, inner as u32, MAX_GROUP as u32, 0],
            });
        }
        let queue = encode(&ops);
        let _guard = self.submit.lock().unwrap_or_else(|e| e.into_inner());
        let mut qbuf = self.session.alloc(queue.len()).map_err(RunError::Rpc)?;
        qbuf.bytes_mut().copy_from_slice(&queue);
        let mut scratch = self
            .session
            .alloc(arena.bytes.len())
            .map_err(RunError::Rpc)?;
        scratch.bytes_mut().copy_from_slice(&arena.bytes);
        self.session.run_queue(&qbuf, &[&scratch, shared])?;
        Ok(outputs
            .iter()
            .map(|out| {
                scratch.bytes()[out.offset as usize..(out.offset + out.len) as usize]
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect()
            })
            .collect())
    }

    /// `y[cout][lout]` = the convolution as `im2col(x)[lout][k·cin] · w[cout][k·cin]ᵀ` on HMX, plus the bias.
    fn hmx_conv(
        &self,
        w: &DspConv,
        x: &[f32],
        len: usize,
        dilation: usize,
        y: &mut [f32],
    ) -> Result<(), RunError> {
        let lout = len - (w.k - 1) * dilation;
        let dims = (w.cin, len, w.k, dilation);
        let product = self.conv_products(x, dims, &w.shared, &[(w.tiles, w.cout)])?;
        for (i, v) in product[0].iter().enumerate() {
            let (t, co) = (i / w.cout, i % w.cout);
            y[co * lout + t] = v + w.bias[co];
        }
        Ok(())
    }

    fn upload_dsp_conv_transpose(
        &self,
        w: &[f32],
        (cin, cout, k): (usize, usize, usize),
        stride: usize,
    ) -> Result<DspConvTranspose, String> {
        let mut arena = Arena::default();
        let phases = conv_transpose_phase_tiles(w, cin, cout, k, stride)
            .iter()
            .map(|tiles| Slice {
                buffer: 1,
                ..arena.push(&u16_bytes(&tiles.data))
            })
            .collect();
        let mut shared = self.session.alloc(arena.bytes.len())?;
        shared.bytes_mut().copy_from_slice(&arena.bytes);
        Ok(DspConvTranspose {
            cpu: self.cpu.upload_conv_transpose1d(w, cin, cout, k, stride),
            shared,
            phases,
            cin,
            cout,
            k,
            stride,
        })
    }

    /// The full transposed convolution `y[cout][(len − 1)·stride + k]` as one fp16 tile product per output phase
    /// on HMX, all in one queue.
    fn hmx_conv_transpose(
        &self,
        w: &DspConvTranspose,
        x: &[f32],
        len: usize,
        y: &mut [f32],
    ) -> Result<(), RunError> {
        let taps = w.k.div_ceil(w.stride);
        let full = (len - 1) * w.stride + w.k;
        let padded = pad_columns(x, w.cin, len, taps - 1);
        let dims = (w.cin, len + 2 * (taps - 1), taps, 1);
        let weights: Vec<(Slice, usize)> = w.phases.iter().map(|&s| (s, w.cout)).collect();
        let products = self.conv_products(&padded, dims, &w.shared, &weights)?;
        for (p, product) in products.iter().enumerate() {
            scatter_phase(product, p, w.stride, w.cout, y, full);
        }
        Ok(())
    }

    /// Runs `hmx` unless the DSP said it has no HMX; false (the caller then uses the CPU) when it did not run.
    fn try_hmx(&self, hmx: impl FnOnce() -> Result<(), RunError>) -> bool {
        if self.hmx.load(Ordering::Relaxed) == HMX_NO {
            return false;
        }
        match hmx() {
            Ok(()) => {
                self.hmx.store(HMX_YES, Ordering::Relaxed);
                true
            }
            Err(RunError::Rejected { status, .. }) if status == STATUS_UNSUPPORTED => {
                if self.hmx.swap(HMX_NO, Ordering::Relaxed) != HMX_NO {
                    eprintln!(
                        "kazeia-backend-hexagon: this DSP build has no HMX; convolutions run on the CPU"
                    );
                }
                false
            }
            Err(e) => {
                eprintln!("kazeia-backend-hexagon: {e}; running the convolution on the CPU");
                false
            }
        }
    }

    fn upload_dsp_linear(&self, cpu: Weight) -> Result<DspLinear, String> {
        let bytes = self.cpu.export_linear(&cpu).ok_or("not a linear weight")?;
        let rows = QuantRows::from_cpu_export(&bytes)?;
        let hvx = to_hvx(&rows);
        let mut arena = Arena::default();
        let quants = arena.push(&hvx.quants);
        let scales = arena.push(&f32_bytes(&hvx.scales));
        let mut shared = self.session.alloc(arena.bytes.len())?;
        shared.bytes_mut().copy_from_slice(&arena.bytes);
        Ok(DspLinear {
            cpu,
            shared,
            quants: Slice {
                buffer: 1,
                ..quants
            },
            scales: Slice {
                buffer: 1,
                ..scales
            },
            rows,
        })
    }

    /// One matvec per row through the queue ([`linear_queue`]).
    fn dsp_linear(
        &self,
        w: &DspLinear,
        x: &[f32],
        rows: usize,
        y: &mut [f32],
    ) -> Result<(), String> {
        let mut arena = Arena::default();
        let (ops, outputs) = linear_queue(&w.rows, w.quants, w.scales, x, rows, &mut arena);
        let queue = encode(&ops);
        let _guard = self
            .submit
            .lock()
            .map_err(|_| "a DSP submission panicked")?;
        let mut qbuf = self.session.alloc(queue.len())?;
        qbuf.bytes_mut().copy_from_slice(&queue);
        let mut scratch = self.session.alloc(arena.bytes.len())?;
        scratch.bytes_mut().copy_from_slice(&arena.bytes);
        self.session
            .run_queue(&qbuf, &[&scratch, &w.shared])
            .map_err(|e| e.to_string())?;
        linear_result(&w.rows, scratch.bytes(), &outputs, y);
        Ok(())
    }
}

/// The queue of a linear layer of `rows` rows of `x` on the DSP, as the backend submits it (and the
/// qemu-hexagon tests run it): per row, the activations quantised into `arena` (buffer 0) and one HVX matvec
/// over the weight's `quants` and `scales` (where the weight lies: its own shared buffer on a device, the
/// arena under emulation); returns the ops and where each row's sums land.
pub fn linear_queue(
    w: &QuantRows,
    quants: Slice,
    scales: Slice,
    x: &[f32],
    rows: usize,
    arena: &mut Arena,
) -> (Vec<QueueOp>, Vec<Slice>) {
    let (out, inp) = (w.out, x.len() / rows);
    let mut ops = Vec::new();
    let mut outputs = Vec::new();
    for r in 0..rows {
        let (xq, xs) = quantize_activations(&x[r * inp..(r + 1) * inp], w.padded_in);
        let xq: Vec<u8> = xq.iter().map(|&v| v as u8).collect();
        let xq = arena.push(&xq);
        let xs = arena.push(&f32_bytes(&xs));
        let ys = arena.reserve(out * 4);
        outputs.push(ys);
        ops.push(QueueOp {
            kind: QueueKind::Matvec,
            format: w.format.code(),
            args: [quants, scales, xq, xs, ys],
            dims: [out as u32, w.padded_in as u32, 0, 0, 0],
        });
    }
    (ops, outputs)
}

/// `y[rows][out]` from the sums [`linear_queue`]'s ops left in `scratch` (the arena after the queue ran), bias
/// added.
pub fn linear_result(w: &QuantRows, scratch: &[u8], outputs: &[Slice], y: &mut [f32]) {
    for (r, s) in outputs.iter().enumerate() {
        let bytes = &scratch[s.offset as usize..(s.offset + s.len) as usize];
        for (o, c) in bytes.chunks_exact(4).enumerate() {
            let bias = w.bias.as_ref().map_or(0.0, |b| b[o]);
            y[r * w.out + o] = f32::from_le_bytes(c.try_into().unwrap()) + bias;
        }
    }
}

fn u16_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl HexagonBackend {
    /// A linear layer: matvecs on the DSP for a few rows of a weight it holds, else the CPU backend.
    fn linear(&self, w: &Weight, x: &[f32], rows: usize, y: &mut [f32]) {
        match w.downcast::<DspLinear>() {
            Some(dsp) if rows <= DSP_MAX_ROWS => {
                if let Err(e) = self.dsp_linear(dsp, x, rows, y) {
                    eprintln!("kazeia-backend-hexagon: {e}; running the layer on the CPU");
                    self.cpu.linear(&dsp.cpu, x, rows, y);
                }
            }
            Some(dsp) => self.cpu.linear(&dsp.cpu, x, rows, y),
            None => self.cpu.linear(w, x, rows, y),
        }
    }

    /// A convolution: on HMX for a weight it holds while the DSP has HMX, else the CPU backend.
    fn conv1d(&self, w: &Weight, x: &[f32], len: usize, dilation: usize, y: &mut [f32]) {
        let Some(conv) = w.downcast::<DspConv>() else {
            return self.cpu.conv1d(w, x, len, dilation, y);
        };
        if !self.try_hmx(|| self.hmx_conv(conv, x, len, dilation, y)) {
            self.cpu.conv1d(&conv.cpu, x, len, dilation, y)
        }
    }

    /// A transposed convolution: on HMX as [`HexagonBackend::conv1d`], else the CPU backend.
    fn conv_transpose1d(&self, w: &Weight, x: &[f32], len: usize, y: &mut [f32]) {
        let Some(conv) = w.downcast::<DspConvTranspose>() else {
            return self.cpu.conv_transpose1d(w, x, len, y);
        };
        if !self.try_hmx(|| self.hmx_conv_transpose(conv, x, len, y)) {
            self.cpu.conv_transpose1d(&conv.cpu, x, len, y)
        }
    }

    /// One op on a weight this backend holds: on the DSP (a linear layer of a few rows, a convolution while HMX
    /// runs), else on the weight's CPU copy.
    ///
    /// # Safety
    /// The op's weight must be a live `Weight` this backend made.
    unsafe fn run_op(&self, op: &OpRecord, x: &[f32], y: &mut [f32]) -> Result<(), String> {
        // SAFETY: a live `Weight` this backend made (this function's contract).
        let w = unsafe { (op.weight as *const Weight).as_ref() }.ok_or("an op without a weight")?;
        let n = op.n.map(|v| v as usize);
        match OpKind::from_code(op.kind) {
            Some(OpKind::Linear) => self.linear(w, x, n[0], y),
            Some(OpKind::Conv1d) => self.conv1d(w, x, n[0], n[1], y),
            Some(OpKind::ConvTranspose1d) => self.conv_transpose1d(w, x, n[0], y),
            _ => return Err(format!("an op of kind {} on a DSP weight", op.kind)),
        }
        Ok(())
    }
}

/// Whether `w` is one of the weights this backend makes.
fn is_dsp_weight(w: &Weight) -> bool {
    w.downcast::<DspLinear>().is_some()
        || w.downcast::<DspConv>().is_some()
        || w.downcast::<DspConvTranspose>().is_some()
}

impl Backend for HexagonBackend {
    fn name(&self) -> &str {
        "hexagon"
    }

    /// Q8_0/Q4_0 linear layers and (while the DSP has HMX) f32 convolutions go to the DSP's shared memory with a
    /// CPU copy; every other weight is refused, and the engine holds it on its CPU with the ops on it.
    fn upload(&self, weight: WeightData<'_>) -> Result<Weight, String> {
        weight.check()?;
        let hmx = self.hmx.load(Ordering::Relaxed) != HMX_NO;
        match weight {
            WeightData::Linear {
                format: WeightFormat::Q8_0 | WeightFormat::Q4_0,
                ..
            } => Ok(Weight::new(
                self.upload_dsp_linear(self.cpu.upload(weight)?)?,
            )),
            // The DSP holds f32 convolutions; an f16 one stays on the engine's CPU, which holds it in f16.
            WeightData::Conv1d {
                w,
                cout,
                cin,
                k,
                bias,
                format: WeightFormat::F32,
            } if hmx => Ok(Weight::new(self.upload_dsp_conv(
                w,
                (cout, cin, k),
                bias,
            )?)),
            WeightData::ConvTranspose1d {
                w,
                cin,
                cout,
                k,
                stride,
                format: WeightFormat::F32,
            } if hmx => Ok(Weight::new(self.upload_dsp_conv_transpose(
                w,
                (cin, cout, k),
                stride,
            )?)),
            _ => Err(
                "the DSP holds Q8_0/Q4_0 linear layers and, with HMX, f32 convolutions only".into(),
            ),
        }
    }

    /// The ops on its own weights; the engine runs the rest on its CPU.
    fn supports(&self, op: &OpRecord, _lens: [usize; 4]) -> bool {
        let kind = OpKind::from_code(op.kind);
        if op.out == NO_TENSOR {
            // Asked about the kind: the weighted ones the DSP runs.
            return matches!(
                kind,
                Some(OpKind::Linear | OpKind::Conv1d | OpKind::ConvTranspose1d)
            );
        }
        // SAFETY: an op's weight is null or a live `Weight` (the trait's contract for ops).
        let weight = unsafe { (op.weight as *const Weight).as_ref() };
        weight.is_some_and(is_dsp_weight)
    }

    unsafe fn run_list(&self, list: List<'_>) -> Result<(), String> {
        let run = |op: &OpRecord, [x, _, _]: [&[f32]; 3], y: &mut [f32]| {
            // SAFETY: the weight is this backend's (`run_list`'s contract; `supports` takes no other op).
            unsafe { self.run_op(op, x, y) }
        };
        // SAFETY: the list's memory follows `run_list`'s contract.
        unsafe { kazeia_backend_cpu::records::each_op(list, run) }
    }
}
