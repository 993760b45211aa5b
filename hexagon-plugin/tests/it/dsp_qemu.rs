//! The DSP side under emulation: `dsp/` compiled by Debian's clang for Hexagon v66 with 128-byte HVX into a
//! freestanding program, run by `qemu-hexagon` on op queues made by the plugin's own encoder over weights the
//! plugin repacked from the CPU backend's quantisation; every output compared bit for bit with
//! `kazeia_backend_hexagon::reference`. Skipped (with the reason) only where clang or qemu-hexagon is missing
//! and `CI` is unset: CI installs both through tools/deps.sh.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use kazeia_backend_abi::{Backend, WeightFormat};
use kazeia_backend_cpu::CpuBackend;
use kazeia_backend_hexagon::queue::{encode, Arena, QueueKind, QueueOp, Slice};
use kazeia_backend_hexagon::reference::{
    conv1d_i16, conv_transpose1d_i16, matvec, quantize_activations,
};
use kazeia_backend_hexagon::repack::{
    conv_weight_tiles, im2col_tiles, tile_matmul_grouped, to_hvx, F16Tiles, QuantRows,
};

const QEMU: &str = "qemu-hexagon";
const SOURCES: [&str; 7] = [
    "qemu_harness.c",
    "qemu_runtime.c",
    "queue_exec.c",
    "hvx_matvec.c",
    "hvx_conv.c",
    "tile_matmul.c",
    "tile_emulated.c",
];

/// The DSP sources (`dsp/`).
fn dsp_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("dsp")
}

/// clang for the Hexagon version `arch` (`-mv66`, `-mv68`) with 128-byte HVX, every warning an error.
fn hexagon_clang(arch: &str) -> Command {
    let mut clang = Command::new("clang");
    clang.args(["--target=hexagon", arch, "-mhvx", "-mhvx-length=128b"]);
    clang.args(["-Wall", "-Wextra", "-Werror"]);
    clang
}

/// Runs `clang`, which must succeed (its errors in the failure).
fn assert_clang_succeeds(clang: &mut Command) {
    let output = clang.output().expect("cannot run clang");
    assert!(
        output.status.success(),
        "clang failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The harness binary, or why it cannot be built here.
pub(crate) fn harness() -> Option<PathBuf> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let missing = |tool: &str| Command::new(tool).arg("--version").output().is_err();
            for tool in ["clang", QEMU] {
                if missing(tool) {
                    assert!(
                        std::env::var_os("CI").is_none(),
                        "{tool} is missing in CI (tools/deps.sh installs it)"
                    );
                    eprintln!(
                        "SKIPPED: {tool} is not installed (apt-get install clang lld qemu-user)"
                    );
                    return None;
                }
            }
            let dsp = dsp_dir();
            let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kazeia-hexagon-harness");
            let mut clang = hexagon_clang("-mv66");
            clang
                .args([
                    "-O2",
                    "-ffp-contract=off",
                    // The HMX tile path with its software engine (the device build has -DKAZEIA_HMX instead).
                    "-DKAZEIA_TILE_EMULATION",
                ])
                .args(["-ffreestanding", "-nostdlib", "-static", "-fuse-ld=lld"])
                .args(SOURCES.iter().map(|s| dsp.join(s)))
                .arg("-o")
                .arg(&out);
            assert_clang_succeeds(&mut clang);
            Some(out)
        })
        .clone()
}

/// Runs `ops` over `arena` (buffer 0) on the emulated DSP: the status word, the failed op, the arena after.
pub(crate) fn run(harness: &Path, ops: &[QueueOp], arena: &Arena) -> (u32, u32, Vec<u8>) {
    let queue = encode(ops);
    let mut input = vec![0u8; 128];
    input[..4].copy_from_slice(&(queue.len() as u32).to_le_bytes());
    input[4..8].copy_from_slice(&(arena.bytes.len() as u32).to_le_bytes());
    input.extend_from_slice(&queue);
    input.resize(128 + queue.len().next_multiple_of(128), 0);
    input.extend_from_slice(&arena.bytes);
    let mut child = Command::new(QEMU)
        .arg(harness)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("cannot run qemu-hexagon");
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "harness exit status {}",
        output.status
    );
    let out = output.stdout;
    assert_eq!(out.len(), 8 + arena.bytes.len(), "harness output size");
    let word = |i: usize| u32::from_le_bytes(out[i * 4..i * 4 + 4].try_into().unwrap());
    (word(0), word(1), out[8..].to_vec())
}

/// Pseudo-random int16 over the whole range (so int32 sums wrap and wrapping is checked too).
fn i16s(n: usize, seed: u32) -> Vec<i16> {
    (0..n)
        .map(|i| {
            ((i as u32)
                .wrapping_mul(2_246_822_519)
                .wrapping_add(seed.wrapping_mul(3_266_489_917))
                >> 16) as i16
        })
        .collect()
}

fn bytes_of<T: Copy>(v: &[T], f: impl Fn(T) -> Vec<u8>) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

fn le_f32s(v: &[f32]) -> Vec<u8> {
    bytes_of(v, |x| x.to_le_bytes().to_vec())
}

fn le_i16s(v: &[i16]) -> Vec<u8> {
    bytes_of(v, |x| x.to_le_bytes().to_vec())
}

/// The bit patterns of little-endian f32s (compared bit for bit).
fn f32_bits(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Little-endian u16s (fp16 bit patterns).
fn u16s(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// The bit patterns of the expected f32s.
fn bits(want: &[f32]) -> Vec<u32> {
    want.iter().map(|v| v.to_bits()).collect()
}

/// An op of the queue on unquantised data: its slices (the rest unused) and its dims.
fn op(kind: QueueKind, slices: &[Slice], dims: [u32; 5]) -> QueueOp {
    let mut args = [Slice::default(); 5];
    args[..slices.len()].copy_from_slice(slices);
    QueueOp {
        kind,
        format: 0,
        args,
        dims,
    }
}

/// An empty arena and queue, and no expected results yet.
fn empty_queue<T>() -> (Arena, Vec<QueueOp>, Vec<T>) {
    (Arena::default(), Vec::new(), Vec::new())
}

/// Runs the queue, which must succeed (status 0); the arena after it.
fn run_ok(harness: &Path, ops: &[QueueOp], arena: &Arena) -> Vec<u8> {
    let (status, failed, result) = run(harness, ops, arena);
    assert_eq!((status, failed), (0, 0));
    result
}

fn slice_of(bytes: &[u8], s: Slice) -> &[u8] {
    &bytes[s.offset as usize..(s.offset + s.len) as usize]
}

#[test]
fn hvx_matvec_is_bit_exact_for_q8_0_and_q4_0() {
    let Some(harness) = harness() else { return };
    let cpu = CpuBackend::new(1);
    let (mut arena, mut ops, mut expected) = empty_queue();
    // A padded shape (70 rows: 3 tiles; 100 inputs: 4 blocks) and the code predictor's 1024×1024.
    for (out, inp) in [(70, 100), (1024, 1024)] {
        let w = kazeia_tests::values(out * inp, out as u32 + 1);
        let x: Vec<f32> = kazeia_tests::values(inp, 77)
            .iter()
            .map(|v| v * 3.0)
            .collect();
        for format in [WeightFormat::Q8_0, WeightFormat::Q4_0] {
            let lw = cpu.upload_linear(&w, out, inp, None, format);
            let rows = QuantRows::from_cpu_export(&cpu.export_linear(&lw).unwrap()).unwrap();
            let hvx = to_hvx(&rows);
            let (xq, xs) = quantize_activations(&x, rows.padded_in);
            let args = [
                arena.push(&hvx.quants),
                arena.push(&bytes_of(&hvx.scales, |v| v.to_le_bytes().to_vec())),
                arena.push(&bytes_of(&xq, |v| vec![v as u8])),
                arena.push(&le_f32s(&xs)),
                arena.reserve(out * 4),
            ];
            ops.push(QueueOp {
                kind: QueueKind::Matvec,
                format: format.code(),
                args,
                dims: [out as u32, rows.padded_in as u32, 0, 0, 0],
            });
            expected.push((format, out, args[4], matvec(&rows, &xq, &xs)));
        }
    }
    let result = run_ok(&harness, &ops, &arena);
    for (format, out, slice, want) in expected {
        let got = f32_bits(slice_of(&result, slice));
        let want = bits(&want);
        assert_eq!(got, want, "{format} {out} rows");
        assert!(want.iter().any(|&b| b != 0));
    }
}

#[test]
fn hvx_conv1d_and_transposed_conv1d_are_bit_exact() {
    let Some(harness) = harness() else { return };
    let (mut arena, mut ops, mut expected) = empty_queue();
    // Dilated k=7 (2 full 64-output steps and a scalar tail), k=1, and a short input (tail only).
    for (i, &(cout, cin, k, len, dilation)) in
        [(5, 3, 7, 200, 3), (4, 6, 1, 130, 1), (2, 2, 3, 20, 2)]
            .iter()
            .enumerate()
    {
        let w = i16s(cout * cin * k, 10 + i as u32);
        let x = i16s(cin * len, 20 + i as u32);
        let y = arena.reserve(cout * (len - (k - 1) * dilation) * 4);
        let (w_bytes, x_bytes) = (arena.push(&le_i16s(&w)), arena.push(&le_i16s(&x)));
        let dims = [cout, cin, k, len, dilation].map(|d| d as u32);
        ops.push(op(QueueKind::Conv1dI16, &[w_bytes, x_bytes, y], dims));
        expected.push((y, conv1d_i16(&w, &x, (cout, cin, k), len, dilation)));
    }
    // The decoder's upsampling shapes: k = 2·stride, and a k that is not a multiple of the stride.
    for (i, &(cin, cout, k, len, stride)) in [(3, 4, 10, 40, 5), (2, 3, 7, 70, 3), (4, 2, 16, 9, 8)]
        .iter()
        .enumerate()
    {
        let w = i16s(cin * cout * k, 30 + i as u32);
        let x = i16s(cin * len, 40 + i as u32);
        let pad = k.div_ceil(stride) - 1;
        let y = arena.reserve(cout * ((len - 1) * stride + k) * 4);
        let (w_bytes, x_bytes) = (arena.push(&le_i16s(&w)), arena.push(&le_i16s(&x)));
        let scratch = arena.reserve(cin * (len + 2 * pad + 64) * 2);
        let dims = [cin, cout, k, len, stride].map(|d| d as u32);
        ops.push(op(
            QueueKind::ConvTranspose1dI16,
            &[w_bytes, x_bytes, y, scratch],
            dims,
        ));
        expected.push((y, conv_transpose1d_i16(&w, &x, (cin, cout, k), len, stride)));
    }
    let result = run_ok(&harness, &ops, &arena);
    for (n, (slice, want)) in expected.into_iter().enumerate() {
        let got: Vec<i32> = slice_of(&result, slice)
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, want, "op {n}");
    }
}

#[test]
fn the_dsp_refuses_bad_queues_with_a_status() {
    let Some(harness) = harness() else { return };
    let mut arena = Arena::default();
    let x = arena.push(&[0; 256]);
    let y = arena.reserve(64);
    let conv = |x: Slice, y: Slice| op(QueueKind::Conv1dI16, &[x, x, y], [1, 1, 3, 16, 1]);
    // Op 1's output is one byte short of what its dims need: status 2 (bad slice) at op 1, nothing written.
    let short = Slice {
        len: 14 * 4 - 1,
        ..y
    };
    let (status, failed, after) = run(&harness, &[conv(x, y), conv(x, short)], &arena);
    assert_eq!((status, failed), (2, 1));
    assert_eq!(after, arena.bytes);
    // An fp16 tile product summing more inner tiles per group than the accumulator takes: status 3.
    let hmx = QueueOp {
        kind: QueueKind::MatmulF16Tiles,
        ..conv(x, y)
    };
    assert_eq!(hmx.dims[3], 16);
    assert_eq!(run(&harness, &[hmx], &arena).0, 3);
    // A dilation that leaves no output: status 3.
    let mut bad = conv(x, y);
    bad.dims[4] = 8;
    assert_eq!(run(&harness, &[bad], &arena).0, 3);
}

#[test]
fn the_fp16_tile_product_of_the_hmx_path_is_bit_exact_with_its_engine_model() {
    // dsp/tile_matmul.c's tile walk with the software engine (the device swaps in HMX for the engine only),
    // against src/repack.rs `tile_matmul_grouped`: partial tiles on every side, groups that do and do not divide
    // the inner tiles, and a dilated convolution as an im2col product.
    let Some(harness) = harness() else { return };
    let (mut arena, mut ops, mut expected) = empty_queue();
    let mut add = |a: F16Tiles, b: F16Tiles, group: usize, arena: &mut Arena| {
        let tiles = |t: &F16Tiles| bytes_of(&t.data, |v| v.to_le_bytes().to_vec());
        let y = arena.reserve(a.rows * b.rows * 4);
        let (a_tiles, b_tiles) = (arena.push(&tiles(&a)), arena.push(&tiles(&b)));
        let dims = [a.rows as u32, b.rows as u32, a.cols as u32, group as u32, 0];
        ops.push(op(QueueKind::MatmulF16Tiles, &[a_tiles, b_tiles, y], dims));
        expected.push((y, tile_matmul_grouped(&a, &b, group)));
    };
    for (i, &(m, n, k, group)) in [(37, 45, 70, 2), (33, 64, 300, 8), (5, 3, 32, 1)]
        .iter()
        .enumerate()
    {
        let a = F16Tiles::pack(&kazeia_tests::values(m * k, 30 + i as u32), m, k);
        let b = F16Tiles::pack(&kazeia_tests::values(n * k, 40 + i as u32), n, k);
        add(a, b, group, &mut arena);
    }
    let (cout, cin, k, len, dilation) = (20, 12, 7, 50, 3);
    let w = kazeia_tests::values(cout * cin * k, 50);
    let x = kazeia_tests::values(cin * len, 51);
    add(
        im2col_tiles(&x, cin, len, k, dilation),
        conv_weight_tiles(&w, cout, cin, k),
        3,
        &mut arena,
    );
    let result = run_ok(&harness, &ops, &arena);
    for (n, (slice, want)) in expected.iter().enumerate() {
        let got = f32_bits(slice_of(&result, *slice));
        let want = bits(want);
        assert_eq!(got, want, "product {n}");
        assert!(want.iter().any(|&b| b != 0));
    }
}

#[test]
fn the_hmx_engine_compiles_against_the_documented_hexkl_api() {
    // hmx_hexkl.c runs only on a device with the SDK; here it is compiled (no link) with -DKAZEIA_HMX against
    // dsp/sdk_decls/, the HexKL micro functions declared as Qualcomm documents them, with the queue executor.
    if harness().is_none() {
        return;
    }
    let dsp = dsp_dir();
    let mut clang = hexagon_clang("-mv68");
    clang
        .args(["-ffreestanding", "-fsyntax-only", "-DKAZEIA_HMX"])
        .arg("-I")
        .arg(dsp.join("sdk_decls"))
        .args(["hmx_hexkl.c", "tile_matmul.c", "queue_exec.c"].map(|s| dsp.join(s)));
    assert_clang_succeeds(&mut clang);
}

#[test]
fn the_dsp_builds_im2col_tiles_and_runs_a_convolution_on_them_in_one_queue() {
    // `Im2colF16` against `repack::im2col_tiles` byte for byte (a dilated conv, a transposed conv's padded phase
    // input), and a queue chaining it into the tile product: the convolution the host backend sends.
    let Some(harness) = harness() else { return };
    let (mut arena, mut ops, mut tiles_expected) = empty_queue();
    let shapes = [(12, 50, 7, 3), (5, 40, 3, 1), (3, 11, 2, 1)];
    for (i, &(cin, len, k, dilation)) in shapes.iter().enumerate() {
        let x = kazeia_tests::values(cin * len, 60 + i as u32);
        let want = im2col_tiles(&x, cin, len, k, dilation);
        let tiles = arena.reserve(want.data.len() * 2);
        let dims = [cin as u32, len as u32, k as u32, dilation as u32, 0];
        let x_bytes = arena.push(&le_f32s(&x));
        ops.push(op(QueueKind::Im2colF16, &[x_bytes, tiles], dims));
        tiles_expected.push((tiles, want));
    }
    // The first shape's tiles, multiplied by a conv weight in the same queue.
    let (cin, len, k, dilation) = shapes[0];
    let cout = 20;
    let w = conv_weight_tiles(&kazeia_tests::values(cout * cin * k, 70), cout, cin, k);
    let lout = len - (k - 1) * dilation;
    let y = arena.reserve(lout * cout * 4);
    let w_tiles = arena.push(&bytes_of(&w.data, |v| v.to_le_bytes().to_vec()));
    let dims = [lout as u32, cout as u32, (k * cin) as u32, 8, 0];
    ops.push(op(
        QueueKind::MatmulF16Tiles,
        &[tiles_expected[0].0, w_tiles, y],
        dims,
    ));
    let result = run_ok(&harness, &ops, &arena);
    for (n, (slice, want)) in tiles_expected.iter().enumerate() {
        let got = u16s(slice_of(&result, *slice));
        assert_eq!(got, want.data, "im2col {n}");
    }
    let want = bits(&tile_matmul_grouped(&tiles_expected[0].1, &w, 8));
    let got = f32_bits(slice_of(&result, y));
    assert_eq!(got, want, "the convolution on DSP-built tiles");
}

#[test]
fn the_dsp_rounds_to_fp16_as_the_host_does_at_the_edges() {
    // Ties to even, the largest finite value and overflow, subnormals and the underflow to zero, signed zero and
    // infinities, through `Im2colF16` (k = 1: the tiles hold x itself), against the `half` crate.
    let Some(harness) = harness() else { return };
    let ulp = 2f32.powi(-10);
    let x: Vec<f32> = vec![
        1.0 + ulp / 2.0,
        1.0 + 1.5 * ulp,
        -(1.0 + ulp / 2.0),
        65504.0,
        65519.0,
        65520.0,
        -70000.0,
        2f32.powi(-24),
        2f32.powi(-25),
        2f32.powi(-25) * 1.01,
        3.0 * 2f32.powi(-26),
        2f32.powi(-15) * 1.7,
        6.0e-5,
        1e-30,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.333_333_34,
        -2.718_281_7,
        1024.5,
    ];
    let len = x.len();
    let mut arena = Arena::default();
    let tiles = arena.reserve(32 * 32 * 2);
    let x_bytes = arena.push(&le_f32s(&x));
    let im2col = op(
        QueueKind::Im2colF16,
        &[x_bytes, tiles],
        [1, len as u32, 1, 1, 0],
    );
    let result = run_ok(&harness, &[im2col], &arena);
    let got = u16s(slice_of(&result, tiles));
    // Row t of the single column tile holds x[t] in column 0.
    for (t, v) in x.iter().enumerate() {
        assert_eq!(
            got[t * 32],
            half::f16::from_f32(*v).to_bits(),
            "{v:e} (row {t})"
        );
    }
}
