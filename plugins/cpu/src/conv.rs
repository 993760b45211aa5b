//! Convolutions over channel-major signals `x[channels][len]`.
//!
//! A dilated convolution is a sum over kernel taps of GEMMs on column-shifted views of the input; a transposed
//! convolution is split by output phase, so that every tap is again one GEMM whose output columns are strided by
//! the stride. Both are tiled in time so the output tile stays in cache while the taps accumulate into it.
//!
//! The tap panels are kept as `f32`, or as `f16` (half the memory; the codec decoder's 114 M weights under the
//! lossy formats) widened exactly to `f32` just before the GEMMs: the whole layer once per call when it is small
//! (high-rate layers run many time tiles), else one tap at a time per time tile (the large layers run at the
//! low rates, over few tiles). Either way the GEMMs see the same `f32` values, so an `f16` convolution computes
//! exactly what the `f32` one does on weights rounded to `f16`.
//!
//! On aarch64 the taps run instead on a NEON tile kernel (`conv_arm.rs`) that sums all taps into each output tile
//! in registers and widens `f16` weights in registers; `KAZEIA_ARM_CONV=gemm` keeps the path above. On x86-64
//! its twin (`conv_x86.rs`, AVX-512F, else AVX2 + FMA + F16C) does the same; `KAZEIA_X86_CONV=gemm` keeps the
//! path above there.
//!
//! The fast decoder mode ([`ConvPrecision::Fast`]) computes the 1×1 convolutions in f16 arithmetic on aarch64
//! CPUs with FEAT_FP16 (`conv_f16.rs`; `KAZEIA_ARM_CONV=f32` keeps them f32), the 7-tap ones by Winograd's
//! F(6, 7) and the smaller upsamplers' transposed ones by F(4, 2) per output phase (`conv_winograd.rs`).

use std::cell::RefCell;

use half::f16;
use half::slice::HalfFloatSliceExt;
use kazeia_backend_abi::WeightFormat;

use crate::conv_f16;
use crate::conv_winograd::{self, Winograd};
use crate::gemm_call::{for_column_tiles, matmul, MatMut, MatRef, SharedOut};
use crate::par::chunks_mut;

#[cfg(target_arch = "aarch64")]
use crate::conv_arm as arm;
#[cfg(target_arch = "x86_64")]
use crate::conv_x86 as x86;

/// Output columns per time tile: the output tile stays in L2 across the taps.
const TIME_TILE: usize = 256;

/// `f16` layers of at most this many weights are widened whole once per call (16 MiB of `f32` scratch at most);
/// larger ones a tap per time tile.
const WIDEN_WHOLE_MAX: usize = 4 << 20;

/// Products a tile kernel sums into fresh accumulators before adding them to the output's running sum. One chain of
/// FMAs over all of a layer's `cin · k` products (7168 for the decoder's 1024→1536 input conv) rounds each partial
/// sum as it grows: against the official decoder in f64, the released shape's waveform was ~1.9× as far from the
/// truth as the official f32's (whose GEMMs block their sums); blocks of ~128 products bring it to the official's.
pub(crate) const BLOCK_TERMS: usize = 128;

/// Input channels per block of a tile kernel that sums `taps` products per input channel.
pub(crate) fn channels_per_block(taps: usize) -> usize {
    BLOCK_TERMS.div_ceil(taps.max(1))
}

/// The index in `w[cout][cin][k]` (or, transposed, `w[cin][cout][k]`) of tap panel element `[t][o][i]`.
pub(crate) fn source_index(
    o: usize,
    i: usize,
    t: usize,
    (cout, cin, k): (usize, usize, usize),
    transposed: bool,
) -> usize {
    if transposed {
        (i * cout + o) * k + t
    } else {
        (o * cin + i) * k + t
    }
}

/// Weights at the precision asked for: the `gemm` path's panels and the tile kernels' blocks.
pub(crate) enum Stored {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl Stored {
    /// The `len` `values` stored as `format` (F32 or F16), in a buffer of exactly that size: collected from an
    /// iterator of unknown length, each layer's buffer grew by doubling, through copies that were freed into the
    /// heap (the 0.6B decoder alone at f16: 315 → 306 MB peak RSS).
    pub(crate) fn new(len: usize, values: impl Iterator<Item = f32>, format: WeightFormat) -> Self {
        fn exactly<T>(len: usize, values: impl Iterator<Item = T>) -> Vec<T> {
            let mut stored = Vec::with_capacity(len);
            stored.extend(values);
            assert_eq!(stored.len(), len, "convolution weight size");
            stored
        }
        match format {
            WeightFormat::F16 => Stored::F16(exactly(len, values.map(f16::from_f32))),
            WeightFormat::F32 => Stored::F32(exactly(len, values)),
            other => panic!("a convolution stored as {other} (the ABI's check admits f32 and f16)"),
        }
    }
}

/// The weights `w` as `format` holds them, as f32: rounded to f16 for F16.
fn held(w: &[f32], format: WeightFormat) -> Vec<f32> {
    match format {
        WeightFormat::F16 => w.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
        _ => w.to_vec(),
    }
}

/// How a backend computes its convolutions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConvPrecision {
    /// Direct f32 sums in blocks: as close to the exact result as the official f32 decoder (the default).
    #[default]
    Exact,
    /// Winograd's F(2, k) for the convolutions that suit it (`conv_winograd.rs`): fewer multiplications, a few
    /// more ulps of rounding (`KAZEIA_CONV_WINOGRAD=1`).
    Winograd,
    /// The fast decoder mode: Winograd's F(6, k) in f32 for the convolutions that suit it (the vocoder's 7-tap
    /// residual ones: 2 multiplications an output per channel pair instead of 7), F(4, 2) per output phase for
    /// the transposed ones that suit it (its smaller upsamplers: 1.25 instead of 2), direct sums for the others.
    /// Not exact: ~1e-4 of the exact waveform (`engine-core/tests/it/codec_fast.rs` holds it to 40 dB SNR). On
    /// an aarch64 CPU with FEAT_FP16 the 1×1 ones run in f16 arithmetic (`conv_f16.rs`: `FMLA .8h`, twice the
    /// multiply-adds per instruction), as [`ConvPrecision::FastF16`] says.
    Fast,
    /// The fast mode as an aarch64 CPU with FEAT_FP16 computes it, on any CPU: [`ConvPrecision::Fast`] with the
    /// 1×1 convolutions in f16 arithmetic (`conv_f16.rs`), emulated bit for bit where the CPU has none (two
    /// orders of magnitude slower than f32 on those layers): what measures the ARM fast decoder's accuracy on
    /// other machines.
    FastF16,
}

impl ConvPrecision {
    /// The convolution kernel this precision runs, in words (for logs and `kazeia bench`).
    pub fn kernel(self) -> &'static str {
        match self {
            ConvPrecision::Exact => "direct f32 sums (exact)",
            ConvPrecision::Winograd => "Winograd F(2, 7) for the 7-tap ones, f32",
            ConvPrecision::Fast if conv_f16::Kernel::native().is_none() => {
                "Winograd F(6, 7) for the 7-tap ones, F(4, 2) per phase for the upsamplers, f32"
            }
            ConvPrecision::Fast | ConvPrecision::FastF16 => {
                "Winograd F(6, 7) for the 7-tap ones, F(4, 2) per phase for the upsamplers, f32; f16 \
                 arithmetic for the 1×1 ones"
            }
        }
    }

    /// The f16 kernel this precision runs the 1×1 convolutions on, if any: the fast mode's where the CPU has
    /// f16 arithmetic, [`ConvPrecision::FastF16`]'s everywhere (emulated where the CPU has none).
    fn f16_kernel(self) -> Option<conv_f16::Kernel> {
        match self {
            ConvPrecision::Fast => conv_f16::Kernel::native(),
            ConvPrecision::FastF16 => Some(conv_f16::Kernel::native_or_emulated()),
            ConvPrecision::Exact | ConvPrecision::Winograd => None,
        }
    }

    /// Outputs per Winograd tile, for the convolutions that suit it; `None`: all direct.
    fn winograd_tile(self) -> Option<usize> {
        match self {
            ConvPrecision::Exact => None,
            ConvPrecision::Winograd => Some(conv_winograd::M),
            ConvPrecision::Fast | ConvPrecision::FastF16 => Some(conv_winograd::FAST_M),
        }
    }
}

/// Per-tap `[cout][cin]` panels, `[k][cout][cin]`.
struct Panels(Stored);

thread_local! {
    /// Widened `f16` panels, or the x86 tile kernel's packed inputs (reused: a fresh allocation of megabytes per
    /// call would fault its pages in each time).
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on what `fill` writes into this thread's scratch buffer.
pub(crate) fn with_scratch<R>(fill: impl FnOnce(&mut Vec<f32>), f: impl FnOnce(&[f32]) -> R) -> R {
    with_scratch_in(&SCRATCH, fill, f)
}

/// Runs `f` on what `fill` writes into the thread-local buffer `key`.
pub(crate) fn with_scratch_in<T, R>(
    key: &'static std::thread::LocalKey<RefCell<Vec<T>>>,
    fill: impl FnOnce(&mut Vec<T>),
    f: impl FnOnce(&[T]) -> R,
) -> R {
    key.with(|scratch| {
        // A thread that waits in a parallel section may run another convolution's tile meanwhile: that one fills
        // a buffer of its own.
        match scratch.try_borrow_mut() {
            Ok(mut scratch) => {
                fill(&mut scratch);
                f(&scratch)
            }
            Err(_) => {
                let mut own = Vec::new();
                fill(&mut own);
                f(&own)
            }
        }
    })
}

impl Panels {
    /// Splits `w[cout][cin][k]` (or, transposed, `w[cin][cout][k]`) into tap panels stored as `format` (F32 or
    /// F16).
    fn new(
        w: &[f32],
        (cout, cin, k): (usize, usize, usize),
        transposed: bool,
        format: WeightFormat,
    ) -> Self {
        let dims = (cout, cin, k);
        let at = |j: usize| {
            let (t, rest) = (j / (cout * cin), j % (cout * cin));
            w[source_index(rest / cin, rest % cin, t, dims, transposed)]
        };
        Panels(Stored::new(
            k * cout * cin,
            (0..k * cout * cin).map(at),
            format,
        ))
    }

    fn len(&self) -> usize {
        match &self.0 {
            Stored::F32(p) => p.len(),
            Stored::F16(p) => p.len(),
        }
    }

    /// Runs `f(panels, first)` with the panels of `taps` as `f32` (`panel` elements each), `first` the index in
    /// the slice of the first tap's first element: the `f32` panels themselves, or the `f16` ones of `taps`
    /// widened into this thread's scratch.
    fn with_f32<R>(
        &self,
        taps: std::ops::Range<usize>,
        panel: usize,
        f: impl FnOnce(&[f32], usize) -> R,
    ) -> R {
        match &self.0 {
            Stored::F32(p) => f(p, taps.start * panel),
            Stored::F16(p) => {
                let src = &p[taps.start * panel..taps.end * panel];
                let widen = |scratch: &mut Vec<f32>| {
                    scratch.resize(src.len(), 0.0);
                    src.convert_to_f32_slice(scratch);
                };
                with_scratch(widen, |w| f(w, 0))
            }
        }
    }

    /// Calls `gemm_tap(panels, first, tap, c0, c1, par)` for each of the `k` taps of every time tile `c0..c1` of
    /// `cols` columns, `first` the index of the tap's panel in `panels`: the whole layer widened once per call,
    /// or (large f16 layers) one tap per tile.
    fn for_each_tap(
        &self,
        k: usize,
        panel: usize,
        cols: usize,
        par: gemm::Parallelism,
        gemm_tap: impl Fn(&[f32], usize, usize, usize, usize, gemm::Parallelism) + Sync,
    ) {
        if self.widen_whole() || matches!(self.0, Stored::F32(_)) {
            self.with_f32(0..k, panel, |w, first| {
                for_column_tiles(cols, TIME_TILE, par, |c0, c1, par| {
                    for tap in 0..k {
                        gemm_tap(w, first + tap * panel, tap, c0, c1, par);
                    }
                });
            });
        } else {
            for_column_tiles(cols, TIME_TILE, par, |c0, c1, par| {
                for tap in 0..k {
                    self.with_f32(tap..tap + 1, panel, |w, first| {
                        gemm_tap(w, first, tap, c0, c1, par)
                    });
                }
            });
        }
    }

    /// Whether the whole layer is widened once per call (rather than a tap per tile).
    fn widen_whole(&self) -> bool {
        matches!(self.0, Stored::F16(_)) && self.len() <= WIDEN_WHOLE_MAX
    }
}

/// The tap weights, laid out for the kernel that runs them.
enum Taps {
    /// Winograd's F(m, k) (transposed: F(m, 2) per output phase): GEMMs of transformed weights on one of the
    /// layouts below (`conv_winograd.rs`).
    Winograd(Box<Winograd>),
    /// `gemm` GEMMs on `[k][cout][cin]` panels.
    Gemm(Panels),
    /// f16 arithmetic on `[cout/8][k][cin][8]` f16 blocks (`conv_f16.rs`).
    F16(conv_f16::Blocked),
    /// The NEON tile kernel's `[cout/8][k][cin][8]` blocks.
    #[cfg(target_arch = "aarch64")]
    Neon(arm::Blocked),
    /// The x86 tile kernels' `[cout/rows][group][cin][taps][rows]` blocks.
    #[cfg(target_arch = "x86_64")]
    X86(x86::Blocked),
}

/// Which kernel a new weight is laid out for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Layout {
    Gemm,
    #[cfg(target_arch = "aarch64")]
    Neon,
    #[cfg(target_arch = "x86_64")]
    X86(x86::Isa),
}

impl Layout {
    /// The kernel in use on this CPU for a layer of `cout` outputs: the NEON tile on aarch64 unless
    /// `KAZEIA_ARM_CONV=gemm`, the AVX-512 or AVX2 tile on x86-64 unless `KAZEIA_X86_CONV=gemm` (see
    /// `conv_x86::selected`) or the layer fills less than half its tile of 32 or 16 outputs (the decoder's
    /// output conv has one: 0.48 ms on the tile, 0.10 on `gemm`), else `gemm`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    fn selected(cout: usize) -> Self {
        #[cfg(target_arch = "aarch64")]
        if arm::selected() == arm::Kernel::Neon {
            return Layout::Neon;
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(isa) = x86::selected().filter(|isa| 2 * cout > isa.rows()) {
            return Layout::X86(isa);
        }
        Layout::Gemm
    }
}

impl Taps {
    /// `stride`: a transposed convolution's (its weight is `w[cin][cout][k]`).
    fn new(
        w: &[f32],
        dims: (usize, usize, usize),
        stride: Option<usize>,
        format: WeightFormat,
        layout: Layout,
    ) -> Self {
        let transposed = stride.is_some();
        match layout {
            Layout::Gemm => Taps::Gemm(Panels::new(w, dims, transposed, format)),
            #[cfg(target_arch = "aarch64")]
            Layout::Neon => Taps::Neon(arm::Blocked::new(w, dims, transposed, format)),
            #[cfg(target_arch = "x86_64")]
            Layout::X86(isa) => {
                assert!(
                    isa.available(),
                    "the {} kernel on a CPU without it",
                    isa.name()
                );
                Taps::X86(x86::Blocked::new(w, dims, stride, format, isa))
            }
        }
    }

    /// The `gemm` path's panels (the callers have sent the tile layouts to their kernels already).
    fn panels(&self) -> &Panels {
        match self {
            Taps::Gemm(panels) => panels,
            Taps::Winograd(_) => unreachable!("Winograd convolutions run their own GEMMs"),
            Taps::F16(_) => unreachable!("f16 convolutions run their own kernel"),
            #[cfg(target_arch = "aarch64")]
            Taps::Neon(_) => unreachable!("the NEON layout runs on its own kernel"),
            #[cfg(target_arch = "x86_64")]
            Taps::X86(_) => unreachable!("the x86 tile layout runs on its own kernel"),
        }
    }
}

/// A `Conv1d` weight, repacked as `k` tap panels `[cout][cin]` (or, for the wide ones, as Winograd's GEMMs).
pub struct ConvWeight {
    taps: Taps,
    bias: Vec<f32>,
    cout: usize,
    cin: usize,
    k: usize,
}

impl ConvWeight {
    /// `format`: F32, or F16 (lossy: half the memory).
    pub fn new(
        w: &[f32],
        cout: usize,
        cin: usize,
        k: usize,
        bias: Option<&[f32]>,
        format: WeightFormat,
    ) -> Self {
        Self::with_layout(w, (cout, cin, k), bias, format, Layout::selected(cout))
    }

    /// As [`ConvWeight::new`], computed as `precision` says: by Winograd's F(m, k) where the layer suits it
    /// (`conv_winograd.rs`: fewer multiplications, more rounding, and an F16 layer rounds the transformed weights
    /// rather than the weights), else directly.
    pub fn with_precision(
        w: &[f32],
        (cout, cin, k): (usize, usize, usize),
        bias: Option<&[f32]>,
        format: WeightFormat,
        precision: ConvPrecision,
    ) -> Self {
        let layout = Layout::selected(cout);
        if let Some(kernel) = precision.f16_kernel() {
            if conv_f16::suits(cout, cin, k) {
                // An F32 layer's weights are rounded to f16 as well: part of the arithmetic (`conv_f16.rs`).
                let taps = Taps::F16(conv_f16::Blocked::new(w, (cout, cin, k), kernel));
                return Self::assemble(taps, bias, (cout, cin, k));
            }
        }
        match precision.winograd_tile() {
            // F(6, k)'s transformed weights span powers of 3 with cancellations between them: rounded to f16 they
            // put a layer ~1e-2 from its output (F(2, k): ~1e-3), so the fast mode holds them as f32, from the
            // weights as the format holds them (an F16 layer is the F32 one on the weights rounded to f16).
            Some(m)
                if conv_winograd::suits(cout, cin, k, m)
                    && matches!(precision, ConvPrecision::Fast | ConvPrecision::FastF16) =>
            {
                Self::winograd_f32(w, (cout, cin, k), bias, format, layout, m)
            }
            Some(m) if conv_winograd::suits(cout, cin, k, m) => {
                Self::winograd(w, (cout, cin, k), bias, format, layout, m)
            }
            _ => Self::with_layout(w, (cout, cin, k), bias, format, layout),
        }
    }

    /// [`ConvWeight::winograd`] with the transformed weights held as f32 whatever `format`, computed from the
    /// weights as `format` holds them (an F16 layer is the F32 one on the weights rounded to f16).
    pub(crate) fn winograd_f32(
        w: &[f32],
        dims: (usize, usize, usize),
        bias: Option<&[f32]>,
        format: WeightFormat,
        layout: Layout,
        m: usize,
    ) -> Self {
        Self::winograd(&held(w, format), dims, bias, WeightFormat::F32, layout, m)
    }

    /// Computed by Winograd's F(m, k), its GEMMs on `layout` (`conv_winograd.rs`).
    pub(crate) fn winograd(
        w: &[f32],
        (cout, cin, k): (usize, usize, usize),
        bias: Option<&[f32]>,
        format: WeightFormat,
        layout: Layout,
        m: usize,
    ) -> Self {
        let winograd = Winograd::new(w, (cout, cin, k), format, layout, m);
        Self::assemble(Taps::Winograd(Box::new(winograd)), bias, (cout, cin, k))
    }

    /// The weight of `taps`, with `bias` (zeros if none).
    fn assemble(taps: Taps, bias: Option<&[f32]>, (cout, cin, k): (usize, usize, usize)) -> Self {
        let bias = bias.map_or_else(|| vec![0.0; cout], <[f32]>::to_vec);
        assert_eq!(bias.len(), cout, "conv1d bias size");
        ConvWeight {
            taps,
            bias,
            cout,
            cin,
            k,
        }
    }

    pub(crate) fn with_layout(
        w: &[f32],
        (cout, cin, k): (usize, usize, usize),
        bias: Option<&[f32]>,
        format: WeightFormat,
        layout: Layout,
    ) -> Self {
        assert_eq!(w.len(), cout * cin * k, "conv1d weight size");
        let taps = Taps::new(w, (cout, cin, k), None, format, layout);
        Self::assemble(taps, bias, (cout, cin, k))
    }

    pub fn forward(
        &self,
        x: &[f32],
        len: usize,
        dilation: usize,
        y: &mut [f32],
        par: gemm::Parallelism,
    ) {
        let (cout, cin, k) = (self.cout, self.cin, self.k);
        let span = (k - 1) * dilation;
        assert!(len > span, "conv1d input shorter than the kernel span");
        let lout = len - span;
        assert_eq!(x.len(), cin * len, "conv1d input size");
        assert_eq!(y.len(), cout * lout, "conv1d output size");
        if let Taps::Winograd(winograd) = &self.taps {
            return winograd.forward(&self.bias, x, len, dilation, y, par);
        }
        if let Taps::F16(blocks) = &self.taps {
            return conv_f16::conv1d(blocks, &self.bias, x, len, dilation, y, par);
        }
        #[cfg(target_arch = "aarch64")]
        if let Taps::Neon(blocks) = &self.taps {
            return arm::conv1d(blocks, &self.bias, x, len, dilation, y, par);
        }
        #[cfg(target_arch = "x86_64")]
        if let Taps::X86(blocks) = &self.taps {
            return x86::conv1d(blocks, &self.bias, x, len, dilation, y, par);
        }
        let panels = self.taps.panels();
        for (row, b) in y.chunks_exact_mut(lout).zip(&self.bias) {
            row.fill(*b);
        }
        let out = SharedOut::new(y);
        let panel = cout * cin;
        // Tap `tap`'s GEMM into columns c0..c1, its panel at `w[first..]`.
        let gemm_tap = |w: &[f32], first: usize, tap: usize, c0: usize, c1: usize, par| {
            // SAFETY: tiles cover disjoint column ranges of `y`.
            let dst = unsafe { MatMut::from_shared(out, c0, cout, c1 - c0, lout as isize, 1) };
            let w = MatRef::new(w, first, cout, cin, cin as isize, 1);
            let xs = MatRef::new(x, c0 + tap * dilation, cin, c1 - c0, len as isize, 1);
            matmul(dst, w, xs, true, par);
        };
        panels.for_each_tap(k, panel, lout, par, gemm_tap);
    }
}

/// A depthwise `Conv1d` weight `[c][k]`.
pub struct DepthwiseWeight {
    w: Vec<f32>,
    bias: Vec<f32>,
    k: usize,
}

impl DepthwiseWeight {
    pub fn new(w: &[f32], channels: usize, k: usize, bias: Option<&[f32]>) -> Self {
        assert_eq!(w.len(), channels * k, "depthwise weight size");
        let bias = bias.map_or_else(|| vec![0.0; channels], <[f32]>::to_vec);
        assert_eq!(bias.len(), channels, "depthwise bias size");
        DepthwiseWeight {
            w: w.to_vec(),
            bias,
            k,
        }
    }

    pub fn forward(&self, parallel: bool, x: &[f32], len: usize, y: &mut [f32]) {
        let k = self.k;
        let channels = self.bias.len();
        assert!(len >= k, "depthwise input shorter than the kernel");
        let lout = len - (k - 1);
        assert_eq!(x.len(), channels * len, "depthwise input size");
        assert_eq!(y.len(), channels * lout, "depthwise output size");
        chunks_mut(parallel, y, lout, |c, row| {
            let xs = &x[c * len..(c + 1) * len];
            let ws = &self.w[c * k..(c + 1) * k];
            row.fill(self.bias[c]);
            for (tap, &wt) in ws.iter().enumerate() {
                for (o, &xv) in row.iter_mut().zip(&xs[tap..tap + lout]) {
                    *o += wt * xv;
                }
            }
        });
    }
}

/// A `ConvTranspose1d` weight, repacked as `k` tap panels `[cout][cin]` (or, in the fast mode, as Winograd's
/// GEMMs).
pub struct ConvTransposeWeight {
    taps: Taps,
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
}

impl ConvTransposeWeight {
    /// `format`: F32, or F16 (lossy: half the memory).
    pub fn new(
        w: &[f32],
        cin: usize,
        cout: usize,
        k: usize,
        stride: usize,
        format: WeightFormat,
    ) -> Self {
        Self::with_layout(w, (cin, cout, k), stride, format, Layout::selected(cout))
    }

    /// As [`ConvTransposeWeight::new`], computed as `precision` says: in the fast mode, by Winograd's F(m, 2) on
    /// each output phase where the layer suits it (`conv_winograd.rs`), the transformed weights held as f32
    /// (as [`ConvWeight::with_precision`]'s), else directly.
    pub fn with_precision(
        w: &[f32],
        (cin, cout, k): (usize, usize, usize),
        stride: usize,
        format: WeightFormat,
        precision: ConvPrecision,
    ) -> Self {
        let layout = Layout::selected(cout * stride);
        let m = conv_winograd::FAST_TRANSPOSED_M;
        let fast = matches!(precision, ConvPrecision::Fast | ConvPrecision::FastF16);
        if fast && conv_winograd::suits_transposed(cin, cout, k, stride) {
            Self::winograd_f32(w, (cin, cout, k), stride, format, layout, m)
        } else {
            Self::with_layout(w, (cin, cout, k), stride, format, Layout::selected(cout))
        }
    }

    /// Computed by Winograd's F(m, 2) per output phase (kernel `2·stride`), its GEMMs on `layout` in f32, from the
    /// weights as `format` holds them (an F16 layer is the F32 one on the weights rounded to f16).
    pub(crate) fn winograd_f32(
        w: &[f32],
        (cin, cout, k): (usize, usize, usize),
        stride: usize,
        format: WeightFormat,
        layout: Layout,
        m: usize,
    ) -> Self {
        assert_eq!(
            k,
            2 * stride,
            "Winograd's transposed convolutions take kernel 2·stride"
        );
        let held = held(w, format);
        let winograd =
            Winograd::transposed(&held, (cin, cout, stride), WeightFormat::F32, layout, m);
        ConvTransposeWeight {
            taps: Taps::Winograd(Box::new(winograd)),
            cin,
            cout,
            k,
            stride,
        }
    }

    pub(crate) fn with_layout(
        w: &[f32],
        (cin, cout, k): (usize, usize, usize),
        stride: usize,
        format: WeightFormat,
        layout: Layout,
    ) -> Self {
        assert_eq!(w.len(), cin * cout * k, "transposed conv weight size");
        assert!(stride >= 1, "transposed conv stride");
        ConvTransposeWeight {
            taps: Taps::new(w, (cout, cin, k), Some(stride), format, layout),
            cin,
            cout,
            k,
            stride,
        }
    }

    /// `y[co][m·s + r] = Σ_j Σ_ci w[ci][co][r + j·s] · x[ci][m − j]`: for each output phase `r` and tap
    /// `r + j·s`, one GEMM into the columns `r, r + s, r + 2s, …` of `y`. Tiles run over `m`, so concurrent tiles
    /// write disjoint outputs.
    pub fn forward(&self, x: &[f32], len: usize, y: &mut [f32], par: gemm::Parallelism) {
        let (cin, cout, k, s) = (self.cin, self.cout, self.k, self.stride);
        assert!(len >= 1, "transposed conv of an empty input");
        let lfull = (len - 1) * s + k;
        assert_eq!(x.len(), cin * len, "transposed conv input size");
        assert_eq!(y.len(), cout * lfull, "transposed conv output size");
        if let Taps::Winograd(winograd) = &self.taps {
            return winograd.forward_transposed(x, len, y, par);
        }
        #[cfg(target_arch = "aarch64")]
        if let Taps::Neon(blocks) = &self.taps {
            return arm::conv_transpose1d(blocks, s, x, len, y, par);
        }
        #[cfg(target_arch = "x86_64")]
        if let Taps::X86(blocks) = &self.taps {
            return x86::conv_transpose1d(blocks, s, x, len, y, par);
        }
        let panels = self.taps.panels();
        y.fill(0.0);
        let positions = lfull.div_ceil(s);
        let out = SharedOut::new(y);
        let panel = cout * cin;
        // Tap `tap`'s GEMM for positions m0..m1, its panel at `w[first..]`.
        let gemm_tap = |w: &[f32], first: usize, tap: usize, m0: usize, m1: usize, par| {
            let (r, j) = (tap % s, tap / s);
            // input columns t = m − j for m in [m0, m1), clipped to [0, len)
            let t0 = m0.saturating_sub(j);
            let t1 = (m1.saturating_sub(j)).min(len);
            if t0 >= t1 {
                return;
            }
            let first_out = (t0 + j) * s + r;
            // SAFETY: tiles cover disjoint ranges of m, hence disjoint output columns.
            let dst = unsafe {
                MatMut::from_shared(out, first_out, cout, t1 - t0, lfull as isize, s as isize)
            };
            let w = MatRef::new(w, first, cout, cin, cin as isize, 1);
            let xs = MatRef::new(x, t0, cin, t1 - t0, len as isize, 1);
            matmul(dst, w, xs, true, par);
        };
        panels.for_each_tap(k, panel, positions, par, gemm_tap);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Deterministic values in ±`scale`.
    pub(crate) fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    pub(crate) fn rounded(w: &[f32]) -> Vec<f32> {
        w.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
    }

    fn parallelisms() -> [gemm::Parallelism; 2] {
        [gemm::Parallelism::None, gemm::Parallelism::Rayon(2)]
    }

    // The tile kernels' checks (`conv_arm.rs`, `conv_x86.rs`): each kernel runs them with its own tile shape.

    /// `n · u / (1 − n · u)` (u = 2⁻²⁴): the relative bound of an `n`-term `f32` sum, fused or not, in any order.
    fn gamma(n: usize) -> f64 {
        let nu = n as f64 * f64::from(f32::EPSILON) / 2.0;
        nu / (1.0 - nu)
    }

    /// Checks `y` against the exact sums `exact[o]` (f64) with the bound `γ(terms) · Σ|term|` of each output.
    fn check(y: &[f32], exact: &[(f64, f64, usize)], what: &str) {
        for (n, (&got, &(sum, abs, terms))) in y.iter().zip(exact).enumerate() {
            let bound = gamma(terms) * abs;
            let err = (f64::from(got) - sum).abs();
            assert!(
                err <= bound,
                "{what}: output {n} is {got}, exact {sum}: error {err:e} > bound {bound:e}"
            );
        }
    }

    /// `(Σ, Σ|·|, terms)` of each output of the dilated convolution, from the definition.
    fn conv1d_exact(
        w: &[f32],
        bias: &[f32],
        x: &[f32],
        (cout, cin, k): (usize, usize, usize),
        len: usize,
        dilation: usize,
    ) -> Vec<(f64, f64, usize)> {
        let lout = len - (k - 1) * dilation;
        let mut out = Vec::new();
        for o in 0..cout {
            for c in 0..lout {
                let (mut s, mut a) = (f64::from(bias[o]), f64::from(bias[o]).abs());
                for i in 0..cin {
                    for t in 0..k {
                        let p = f64::from(w[(o * cin + i) * k + t])
                            * f64::from(x[i * len + c + t * dilation]);
                        s += p;
                        a += p.abs();
                    }
                }
                out.push((s, a, cin * k + 1));
            }
        }
        out
    }

    /// The same for the transposed convolution: `y[o][n] = Σ_{i, t: n = m·s + t} w[i][o][t] · x[i][m]`.
    fn conv_transpose1d_exact(
        w: &[f32],
        x: &[f32],
        (cin, cout, k): (usize, usize, usize),
        stride: usize,
        len: usize,
    ) -> Vec<(f64, f64, usize)> {
        let lfull = (len - 1) * stride + k;
        let mut out = vec![(0.0, 0.0, 1); cout * lfull];
        for o in 0..cout {
            for i in 0..cin {
                for m in 0..len {
                    for t in 0..k {
                        let p = f64::from(w[(i * cout + o) * k + t]) * f64::from(x[i * len + m]);
                        let e = &mut out[o * lfull + m * stride + t];
                        e.0 += p;
                        e.1 += p.abs();
                        e.2 += 1;
                    }
                }
            }
        }
        out
    }

    /// Output filled with NaN first, so that a tile left unwritten fails the check.
    fn unwritten(n: usize) -> Vec<f32> {
        vec![f32::NAN; n]
    }

    /// Runs `forward(y, par)` into `n` outputs filled with NaN first (so that a tile left unwritten fails the
    /// check) with one and two threads: each result within the bound of `exact`, and the same bits both ways.
    fn check_with_every_parallelism(
        n: usize,
        exact: &[(f64, f64, usize)],
        what: &str,
        forward: impl Fn(&mut [f32], gemm::Parallelism),
    ) {
        let mut first = None;
        for par in parallelisms() {
            let mut y = unwritten(n);
            forward(&mut y, par);
            let what = format!("{what} {par:?}");
            check(&y, exact, &what);
            let bits: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
            assert_eq!(
                *first.get_or_insert(bits.clone()),
                bits,
                "{what}: threads change the bits"
            );
        }
    }

    /// Each weight format with the weights it computes with.
    fn formats(w: &[f32]) -> [(WeightFormat, Vec<f32>); 2] {
        [
            (WeightFormat::F32, w.to_vec()),
            (WeightFormat::F16, rounded(w)),
        ]
    }

    /// A tile kernel's shape: output channels and columns per register tile, columns per time tile.
    #[derive(Clone, Copy)]
    pub(crate) struct TileShape {
        pub rows: usize,
        pub cols: usize,
        pub time_tile: usize,
    }

    /// Awkward dilated convolutions for a tile of `rows × cols`: `cout` and `cin` off the row block, outputs
    /// shorter than a tile and off the column tile, k = 1, dilations up to 9, several time tiles (and the
    /// tile-parallel branch with 2 threads); F32 and F16 weights, 1 and 2 threads.
    pub(crate) fn tile_conv1d_matches_the_exact_sum(layout: Layout, tile: TileShape) {
        let (mr, nr, time_tile) = (tile.rows, tile.cols, tile.time_tile);
        let shapes = [
            // cout, cin, k, dilation, len
            (1, 1, 1, 1, 1),
            (1, 3, 7, 1, 7),
            (mr, mr, 1, 1, nr),
            (mr + 1, 5, 3, 2, nr + 5),
            (mr - 1, 19, 7, 9, nr + 55),
            (2 * mr + 1, 33, 5, 3, nr + 13),
            (2 * mr, 2 * mr, 7, 1, nr + 7),
            (mr + 3, 9, 4, 2, 3 * nr + 11),
            (3 * mr, 10, 3, 1, 4 * time_tile + 13),
            (3, 2, 2, 5, 2 * time_tile + 5),
        ];
        for (cout, cin, k, dilation, len) in shapes {
            let w = values(cout * cin * k, 11, 0.5);
            let bias = values(cout, 12, 0.5);
            let x = values(cin * len, 13, 1.0);
            let lout = len - (k - 1) * dilation;
            for (format, weights) in formats(&w) {
                let layer =
                    ConvWeight::with_layout(&w, (cout, cin, k), Some(&bias), format, layout);
                let exact = conv1d_exact(&weights, &bias, &x, (cout, cin, k), len, dilation);
                let what = format!("conv1d {cout}×{cin}×{k} d{dilation} len {len} {format}");
                check_with_every_parallelism(cout * lout, &exact, &what, |y, par| {
                    layer.forward(&x, len, dilation, y, par)
                });
            }
        }
    }

    /// A long sum (the decoder's 1024→1536 k7 input conv: 7168 products an output), all products positive so
    /// that one chain's partial sums grow with it: the tile kernel's blocked sums are at least twice as close
    /// to the exact ones (RMS over the outputs) as one FMA chain over all products in the same order.
    pub(crate) fn tile_long_sums_are_blocked(layout: Layout, tile: TileShape) {
        let (cout, cin, k, len) = (tile.rows, 1024, 7, tile.cols + 6);
        let positive =
            |n, seed| -> Vec<f32> { values(n, seed, 1.0).iter().map(|v| v.abs()).collect() };
        let (w, bias, x) = (
            positive(cout * cin * k, 31),
            positive(cout, 32),
            positive(cin * len, 33),
        );
        let layer =
            ConvWeight::with_layout(&w, (cout, cin, k), Some(&bias), WeightFormat::F32, layout);
        let exact = conv1d_exact(&w, &bias, &x, (cout, cin, k), len, 1);
        let mut y = unwritten(cout * tile.cols);
        layer.forward(&x, len, 1, &mut y, gemm::Parallelism::None);
        let (mut blocked, mut chain) = (0.0, 0.0);
        for o in 0..cout {
            for c in 0..tile.cols {
                let mut sum = bias[o];
                for i in 0..cin {
                    for t in 0..k {
                        sum = w[(o * cin + i) * k + t].mul_add(x[i * len + c + t], sum);
                    }
                }
                let (truth, _, _) = exact[o * tile.cols + c];
                blocked += (f64::from(y[o * tile.cols + c]) - truth).powi(2);
                chain += (f64::from(sum) - truth).powi(2);
            }
        }
        assert!(
            2.0 * blocked.sqrt() <= chain.sqrt(),
            "{layout:?}: blocked sums {:e} from exact (RMS), one chain {:e}",
            blocked.sqrt(),
            chain.sqrt()
        );
    }

    /// Awkward transposed convolutions for a tile of `rows × cols`: stride < k (the decoder's 2·stride),
    /// stride = k, stride > k (phases without taps), k = 1, one input column, inputs shorter than the taps'
    /// reach, outputs off the tiles, several time tiles.
    pub(crate) fn tile_conv_transpose1d_matches_the_exact_sum(layout: Layout, tile: TileShape) {
        let (mr, nr, time_tile) = (tile.rows, tile.cols, tile.time_tile);
        let shapes = [
            // cin, cout, k, stride, len
            (1, 1, 1, 1, 1),
            (5, mr + 1, 16, 8, 1),
            (3, mr - 1, 4, 2, nr + 1),
            (11, 2 * mr + 1, 3, 5, 7),
            (4, mr, 10, 5, 30),
            (6, 3, 2, 2, 100),
            (13, 2 * mr, 7, 3, 29),
            (5, 6, 1, 1, 20),
            (7, mr + 1, 6, 3, 3 * time_tile + 7),
            // a tile whose last column reads x just past a row end (len + j ≡ nr − 1 mod nr) into a stored
            // output
            (4, mr + 1, 6, 2, 2 * nr - 1),
            (5, mr + 2, 16, 8, 3 * nr - 1),
            // taps reaching 4 columns back over 2 input columns; 3 back over an input long enough for tiles
            // that reach past either end but not both
            (3, 5, 9, 2, 2),
            (6, mr + 3, 12, 3, 2 * nr + 7),
        ];
        for (cin, cout, k, stride, len) in shapes {
            let w = values(cin * cout * k, 21, 0.5);
            let x = values(cin * len, 22, 1.0);
            let lfull = (len - 1) * stride + k;
            for (format, weights) in formats(&w) {
                let layer =
                    ConvTransposeWeight::with_layout(&w, (cin, cout, k), stride, format, layout);
                let exact = conv_transpose1d_exact(&weights, &x, (cin, cout, k), stride, len);
                let what =
                    format!("conv_transpose1d {cin}×{cout}×{k} s{stride} len {len} {format}");
                check_with_every_parallelism(cout * lfull, &exact, &what, |y, par| {
                    layer.forward(&x, len, y, par)
                });
            }
        }
    }

    /// A tile kernel widens F16 weights exactly and runs them through the same chain of fused multiply-adds, so
    /// an F16 layer equals the F32 one on the rounded weights bit for bit (not merely within rounding).
    pub(crate) fn tile_f16_is_f32_on_rounded_weights_bit_for_bit(layout: Layout) {
        let (cout, cin, k) = (19, 21, 7);
        let w = values(cout * cin * k, 31, 0.5);
        let bias = values(cout, 32, 0.5);
        let len = 100;
        let x = values(cin * len, 33, 1.0);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let par = gemm::Parallelism::None;
        let layer = |w: &[f32], format| {
            ConvWeight::with_layout(w, (cout, cin, k), Some(&bias), format, layout)
        };
        let lout = len - (k - 1) * 3;
        let (mut a, mut b) = (unwritten(cout * lout), unwritten(cout * lout));
        layer(&w, WeightFormat::F16).forward(&x, len, 3, &mut a, par);
        layer(&rounded(&w), WeightFormat::F32).forward(&x, len, 3, &mut b, par);
        assert_eq!(bits(&a), bits(&b), "conv1d");
        // Transposed: w[cin][cout][k] with the roles swapped.
        let (cin, cout, stride) = (cout, cin, 4);
        let layer = |w: &[f32], format| {
            ConvTransposeWeight::with_layout(w, (cin, cout, k), stride, format, layout)
        };
        let lfull = (len - 1) * stride + k;
        let x = &x[..cin * len];
        let (mut a, mut b) = (unwritten(cout * lfull), unwritten(cout * lfull));
        layer(&w, WeightFormat::F16).forward(x, len, &mut a, par);
        layer(&rounded(&w), WeightFormat::F32).forward(x, len, &mut b, par);
        assert_eq!(bits(&a), bits(&b), "conv_transpose1d");
    }

    /// A streamed signal's chunks give the whole signal's outputs bit for bit: a dilated convolution over
    /// columns `a..b` of the input gives the whole input's output columns `a..b − span`, whatever tiles the
    /// columns fall in.
    pub(crate) fn tile_outputs_are_those_of_the_whole_signal(layout: Layout) {
        for cout in [37, 16, 8, 1] {
            let (cin, k, dilation, len) = (23, 7, 3, 700);
            let span = (k - 1) * dilation;
            let w = values(cout * cin * k, 41, 0.5);
            let bias = values(cout, 42, 0.5);
            let x = values(cin * len, 43, 1.0);
            for (format, _) in formats(&w) {
                let layer =
                    ConvWeight::with_layout(&w, (cout, cin, k), Some(&bias), format, layout);
                for par in parallelisms() {
                    let lout = len - span;
                    let mut whole = unwritten(cout * lout);
                    layer.forward(&x, len, dilation, &mut whole, par);
                    for (a, b) in [(0, span + 1), (5, 300), (17, 700), (290, 611)] {
                        let part: Vec<f32> = x
                            .chunks_exact(len)
                            .flat_map(|row| row[a..b].iter().copied())
                            .collect();
                        let n = b - a - span;
                        let mut y = unwritten(cout * n);
                        layer.forward(&part, b - a, dilation, &mut y, par);
                        for o in 0..cout {
                            let got: Vec<u32> =
                                y[o * n..][..n].iter().map(|v| v.to_bits()).collect();
                            let want: Vec<u32> = whole[o * lout + a..][..n]
                                .iter()
                                .map(|v| v.to_bits())
                                .collect();
                            assert_eq!(
                                got, want,
                                "{layout:?} cout {cout} {format} {par:?} columns {a}..{b}, output {o}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn gemm_outputs_are_those_of_the_whole_signal() {
        tile_outputs_are_those_of_the_whole_signal(Layout::Gemm);
    }

    /// The `gemm` path (aarch64 too, where `KAZEIA_ARM_CONV=gemm` selects it; the NEON kernel's tests are in
    /// `conv_arm.rs`).
    ///
    /// An f16 convolution is the f32 one on the weights rounded to f16, bit for bit: for a layer widened whole
    /// and for one widened a tap per tile (over `WIDEN_WHOLE_MAX` weights), over several time tiles.
    #[test]
    fn f16_conv1d_is_f32_on_rounded_weights() {
        for (cout, cin, k, dilation, len) in [(24, 40, 7, 3, 700), (512, 520, 17, 1, 300)] {
            let w = values(cout * cin * k, 1, 0.05);
            let bias = values(cout, 2, 0.1);
            let x = values(cin * len, 3, 1.0);
            let layer = |w: &[f32], format| {
                ConvWeight::with_layout(w, (cout, cin, k), Some(&bias), format, Layout::Gemm)
            };
            let half = layer(&w, WeightFormat::F16);
            assert_eq!(
                half.taps.panels().widen_whole(),
                cout * cin * k <= WIDEN_WHOLE_MAX
            );
            let reference = layer(&rounded(&w), WeightFormat::F32);
            let lout = len - (k - 1) * dilation;
            for par in parallelisms() {
                let (mut a, mut b) = (vec![0.0; cout * lout], vec![0.0; cout * lout]);
                half.forward(&x, len, dilation, &mut a, par);
                reference.forward(&x, len, dilation, &mut b, par);
                assert!(
                    a == b,
                    "conv1d {cout}×{cin}×{k}: f16 differs from f32 on rounded weights"
                );
                let mut full = vec![0.0; cout * lout];
                layer(&w, WeightFormat::F32).forward(&x, len, dilation, &mut full, par);
                assert!(a != full, "the f16 weights were not rounded");
            }
        }
    }

    #[test]
    fn f16_conv_transpose1d_is_f32_on_rounded_weights() {
        for (cin, cout, k, stride, len) in [(40, 24, 10, 5, 120), (520, 512, 17, 8, 40)] {
            let w = values(cin * cout * k, 4, 0.05);
            let x = values(cin * len, 5, 1.0);
            let layer = |w: &[f32], format| {
                ConvTransposeWeight::with_layout(w, (cin, cout, k), stride, format, Layout::Gemm)
            };
            let half = layer(&w, WeightFormat::F16);
            assert_eq!(
                half.taps.panels().widen_whole(),
                cout * cin * k <= WIDEN_WHOLE_MAX
            );
            let reference = layer(&rounded(&w), WeightFormat::F32);
            let lfull = (len - 1) * stride + k;
            for par in parallelisms() {
                let (mut a, mut b) = (vec![0.0; cout * lfull], vec![0.0; cout * lfull]);
                half.forward(&x, len, &mut a, par);
                reference.forward(&x, len, &mut b, par);
                assert!(a == b, "conv_transpose1d {cin}×{cout}×{k}: f16 differs");
            }
        }
    }

    /// The fast mode runs the 1×1 convolutions in f16 arithmetic where the CPU has it (aarch64 with FEAT_FP16),
    /// else exactly as the exact mode does (the same bits); `FastF16` always does, emulated where need be. The
    /// 7-tap ones are Winograd's F(6, 7) in both, and every other convolution stays direct f32.
    #[test]
    fn the_fast_mode_takes_f16_arithmetic_for_the_1x1_convolutions_where_the_cpu_has_it() {
        let layer = |dims: (usize, usize, usize), precision| {
            let (cout, cin, k) = dims;
            let w = values(cout * cin * k, 61, 0.1);
            let bias = values(cout, 62, 0.1);
            ConvWeight::with_precision(&w, dims, Some(&bias), WeightFormat::F16, precision)
        };
        let native = conv_f16::Kernel::native();
        for (dims, f16) in [
            ((96, 96, 1), true),
            ((96, 96, 7), false),
            ((8, 96, 3), false),
        ] {
            for precision in [ConvPrecision::Fast, ConvPrecision::FastF16] {
                let taps = &layer(dims, precision).taps;
                let kernel = match taps {
                    Taps::F16(blocks) => Some(blocks.kernel()),
                    _ => None,
                };
                let want = match precision {
                    _ if !f16 => None,
                    ConvPrecision::Fast => native,
                    _ => Some(conv_f16::Kernel::native_or_emulated()),
                };
                assert_eq!(kernel, want, "{dims:?} {precision:?}");
                assert_eq!(matches!(taps, Taps::Winograd(_)), dims == (96, 96, 7));
            }
        }
        let (len, x) = (300, values(96 * 300, 63, 1.0));
        let run = |precision| {
            let mut y = vec![f32::NAN; 96 * len];
            layer((96, 96, 1), precision).forward(&x, len, 1, &mut y, gemm::Parallelism::None);
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let (fast, exact) = (run(ConvPrecision::Fast), run(ConvPrecision::Exact));
        assert_eq!(
            fast == exact,
            native.is_none(),
            "the fast 1×1 convolution is the exact one"
        );
        assert_eq!(run(ConvPrecision::FastF16) == fast, native.is_some());
    }

    #[test]
    fn f32_panels_keep_the_weights() {
        // w[cout][cin][k] → panel [t][o][i], and the transposed layout w[cin][cout][k].
        let (cout, cin, k) = (3, 2, 4);
        let w: Vec<f32> = (0..cout * cin * k).map(|v| v as f32).collect();
        for transposed in [false, true] {
            let Stored::F32(p) = Panels::new(&w, (cout, cin, k), transposed, WeightFormat::F32).0
            else {
                unreachable!()
            };
            for (t, o, i) in
                (0..k).flat_map(|t| (0..cout).flat_map(move |o| (0..cin).map(move |i| (t, o, i))))
            {
                let src = if transposed {
                    (i * cout + o) * k + t
                } else {
                    (o * cin + i) * k + t
                };
                assert_eq!(p[(t * cout + o) * cin + i], w[src]);
            }
        }
    }
}
