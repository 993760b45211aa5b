//! The op queue in shared memory: what the host writes and the DSP executes (`dsp/kazeia_queue.h` is the same
//! format in C).
//!
//! Little-endian, no pointers (the DSP is 32-bit and maps each buffer at its own address): data is named by
//! [`Slice`] = buffer id + byte offset + byte length, the buffer ids being the fds the host passes alongside.
//!
//! ```text
//! header   32 bytes: magic "KZHQ", version u16, header size u16, op count u32, op size u32, 16 reserved
//! op × n   88 bytes: kind u32, format u32, 5 × Slice (12 bytes), 5 × u32 dims
//! ```
//! Slices read by HVX loads start on 128-byte boundaries; [`decode`] checks every slice against the buffer
//! sizes, so a bad queue is an error on both sides, never an out-of-bounds access.

pub const MAGIC: u32 = u32::from_le_bytes(*b"KZHQ");
pub const VERSION: u16 = 1;
pub const HEADER_SIZE: usize = 32;
pub const OP_SIZE: usize = 88;
/// HVX vector size: vector operands start on this boundary.
pub const ALIGN: u32 = 128;

/// The ops the DSP executes (argument meaning per kind in [`QueueOp`]).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueKind {
    /// HVX matvec: args = [weight quants (HVX layout), weight scales, x int8, x scales, y f32];
    /// dims = [out, padded in]. `format` = Q8_0 or Q4_0 code.
    Matvec = 1,
    /// HVX conv1d on int16: args = [w i16 `[cout][cin][k]`, x i16 `[cin][len]`, y i32]; dims = [cout, cin, k,
    /// len, dilation].
    Conv1dI16 = 2,
    /// HVX transposed conv1d on int16: args = [w i16 `[cin][cout][k]`, x i16 `[cin][len]`, y i32, scratch];
    /// dims = [cin, cout, k, len, stride].
    ConvTranspose1dI16 = 3,
    /// fp16 tile product `y = a·bᵀ` (HMX, or its model in emulation builds): args = [a tiles `[m][k]`, b tiles
    /// `[n][k]`, y f32 `[m][n]`]; dims = [m, n, k, group].
    MatmulF16Tiles = 4,
    /// A valid dilated convolution's input as fp16 im2col tiles (`repack::im2col_tiles`): args = [x f32
    /// `[cin][len]`, tiles]; dims = [cin, len, k, dilation].
    Im2colF16 = 5,
}

impl QueueKind {
    fn from_code(code: u32) -> Option<QueueKind> {
        Some(match code {
            1 => QueueKind::Matvec,
            2 => QueueKind::Conv1dI16,
            3 => QueueKind::ConvTranspose1dI16,
            4 => QueueKind::MatmulF16Tiles,
            5 => QueueKind::Im2colF16,
            _ => return None,
        })
    }
}

/// Bytes `offset..offset + len` of buffer `buffer`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slice {
    pub buffer: u32,
    pub offset: u32,
    pub len: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueOp {
    pub kind: QueueKind,
    pub format: u32,
    pub args: [Slice; 5],
    pub dims: [u32; 5],
}

/// Why a queue was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum QueueError {
    Truncated { needed: usize, have: usize },
    BadMagic(u32),
    Version(u16),
    Layout { header: u16, op: u32 },
    UnknownKind { op: usize, kind: u32 },
    OutOfBounds { op: usize, arg: usize },
    Misaligned { op: usize, arg: usize },
}

impl std::fmt::Display for QueueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueError::Truncated { needed, have } => {
                write!(f, "op queue truncated: {have} bytes, {needed} needed")
            }
            QueueError::BadMagic(m) => write!(f, "not an op queue (magic {m:#010x})"),
            QueueError::Version(v) => write!(f, "op queue version {v}, expected {VERSION}"),
            QueueError::Layout { header, op } => {
                write!(f, "op queue with {header}-byte header and {op}-byte ops")
            }
            QueueError::UnknownKind { op, kind } => write!(f, "op {op}: unknown kind {kind}"),
            QueueError::OutOfBounds { op, arg } => {
                write!(f, "op {op}: argument {arg} is outside its buffer")
            }
            QueueError::Misaligned { op, arg } => {
                write!(f, "op {op}: argument {arg} is not {ALIGN}-byte aligned")
            }
        }
    }
}

impl std::error::Error for QueueError {}

/// The queue's bytes for `ops`.
pub fn encode(ops: &[QueueOp]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_SIZE + ops.len() * OP_SIZE);
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(HEADER_SIZE as u16).to_le_bytes());
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    out.extend_from_slice(&(OP_SIZE as u32).to_le_bytes());
    out.resize(HEADER_SIZE, 0);
    for op in ops {
        out.extend_from_slice(&(op.kind as u32).to_le_bytes());
        out.extend_from_slice(&op.format.to_le_bytes());
        for s in &op.args {
            for v in [s.buffer, s.offset, s.len] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        for d in op.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
    }
    out
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// The ops of a queue, every slice checked against `buffer_lens` (bytes of each buffer id). Empty slices
/// (length 0) are unused arguments and are not checked.
pub fn decode(bytes: &[u8], buffer_lens: &[u32]) -> Result<Vec<QueueOp>, QueueError> {
    if bytes.len() < HEADER_SIZE {
        return Err(QueueError::Truncated {
            needed: HEADER_SIZE,
            have: bytes.len(),
        });
    }
    let magic = u32_at(bytes, 0);
    if magic != MAGIC {
        return Err(QueueError::BadMagic(magic));
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != VERSION {
        return Err(QueueError::Version(version));
    }
    let header = u16::from_le_bytes([bytes[6], bytes[7]]);
    let count = u32_at(bytes, 8) as usize;
    let op_size = u32_at(bytes, 12);
    if header as usize != HEADER_SIZE || op_size as usize != OP_SIZE {
        return Err(QueueError::Layout {
            header,
            op: op_size,
        });
    }
    let needed = count
        .checked_mul(OP_SIZE)
        .and_then(|n| n.checked_add(HEADER_SIZE))
        .unwrap_or(usize::MAX);
    if bytes.len() < needed {
        return Err(QueueError::Truncated {
            needed,
            have: bytes.len(),
        });
    }
    (0..count)
        .map(|i| {
            let at = HEADER_SIZE + i * OP_SIZE;
            let code = u32_at(bytes, at);
            let kind =
                QueueKind::from_code(code).ok_or(QueueError::UnknownKind { op: i, kind: code })?;
            let mut args = [Slice::default(); 5];
            for (a, s) in args.iter_mut().enumerate() {
                let p = at + 8 + a * 12;
                *s = Slice {
                    buffer: u32_at(bytes, p),
                    offset: u32_at(bytes, p + 4),
                    len: u32_at(bytes, p + 8),
                };
                if s.len == 0 {
                    continue;
                }
                let end = s.offset as u64 + s.len as u64;
                match buffer_lens.get(s.buffer as usize) {
                    Some(&have) if end <= have as u64 => {}
                    _ => return Err(QueueError::OutOfBounds { op: i, arg: a }),
                }
                if s.offset % ALIGN != 0 {
                    return Err(QueueError::Misaligned { op: i, arg: a });
                }
            }
            let mut dims = [0u32; 5];
            for (d, v) in dims.iter_mut().enumerate() {
                *v = u32_at(bytes, at + 68 + d * 4);
            }
            Ok(QueueOp {
                kind,
                format: u32_at(bytes, at + 4),
                args,
                dims,
            })
        })
        .collect()
}

/// Lays out buffers one after another in a single arena (buffer id 0), each on an [`ALIGN`] boundary.
#[derive(Default)]
pub struct Arena {
    pub bytes: Vec<u8>,
}

impl Arena {
    /// Appends `data` and returns its slice.
    pub fn push(&mut self, data: &[u8]) -> Slice {
        let offset = self.bytes.len().next_multiple_of(ALIGN as usize);
        self.bytes.resize(offset, 0);
        self.bytes.extend_from_slice(data);
        Slice {
            buffer: 0,
            offset: offset as u32,
            len: data.len() as u32,
        }
    }

    /// Reserves `len` zeroed bytes (an output).
    pub fn reserve(&mut self, len: usize) -> Slice {
        self.push(&vec![0; len])
    }

    pub fn get(&self, s: Slice) -> &[u8] {
        &self.bytes[s.offset as usize..(s.offset + s.len) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Vec<QueueOp>, Vec<u32>) {
        let s = |buffer, offset, len| Slice {
            buffer,
            offset,
            len,
        };
        let ops = vec![
            QueueOp {
                kind: QueueKind::Matvec,
                format: 3,
                args: [
                    s(1, 0, 4096),
                    s(1, 4096, 512),
                    s(0, 0, 64),
                    s(0, 128, 8),
                    s(0, 256, 128),
                ],
                dims: [32, 64, 0, 0, 0],
            },
            QueueOp {
                kind: QueueKind::ConvTranspose1dI16,
                format: 0,
                args: [
                    s(2, 0, 96),
                    s(0, 384, 40),
                    s(0, 512, 200),
                    s(0, 768, 100),
                    Slice::default(),
                ],
                dims: [2, 3, 8, 10, u32::MAX],
            },
        ];
        (ops, vec![1024, 8192, 128])
    }

    #[test]
    fn encode_then_decode_round_trips_with_the_documented_sizes() {
        let (ops, lens) = sample();
        let bytes = encode(&ops);
        assert_eq!(bytes.len(), HEADER_SIZE + 2 * OP_SIZE);
        assert_eq!(&bytes[..4], b"KZHQ");
        assert_eq!(decode(&bytes, &lens), Ok(ops));
        assert_eq!(decode(&encode(&[]), &[]), Ok(vec![]));
    }

    #[test]
    fn bad_queues_are_refused_with_the_reason() {
        let (ops, lens) = sample();
        let bytes = encode(&ops);
        assert_eq!(
            decode(&bytes[..bytes.len() - 1], &lens),
            Err(QueueError::Truncated {
                needed: bytes.len(),
                have: bytes.len() - 1
            })
        );
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert!(matches!(decode(&bad, &lens), Err(QueueError::BadMagic(_))));
        let mut bad = bytes.clone();
        bad[4] = 9;
        assert_eq!(decode(&bad, &lens), Err(QueueError::Version(9)));
        let mut bad = bytes.clone();
        bad[HEADER_SIZE] = 77;
        assert_eq!(
            decode(&bad, &lens),
            Err(QueueError::UnknownKind { op: 0, kind: 77 })
        );
        // A huge op count must not overflow the size check.
        let mut bad = bytes.clone();
        bad[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode(&bad, &lens),
            Err(QueueError::Truncated { .. })
        ));
        // One byte past its buffer, a buffer id that does not exist, an unaligned vector operand.
        let mut short = lens.clone();
        short[1] = 4607;
        assert_eq!(
            decode(&bytes, &short),
            Err(QueueError::OutOfBounds { op: 0, arg: 1 })
        );
        assert_eq!(
            decode(&bytes, &lens[..2]),
            Err(QueueError::OutOfBounds { op: 1, arg: 0 })
        );
        let mut moved = ops.clone();
        moved[1].args[2].offset = 520;
        assert_eq!(
            decode(&encode(&moved), &lens),
            Err(QueueError::Misaligned { op: 1, arg: 2 })
        );
        let text = decode(&bytes, &short).unwrap_err().to_string();
        assert_eq!(text, "op 0: argument 1 is outside its buffer");
    }

    #[test]
    fn the_arena_aligns_every_buffer() {
        let mut arena = Arena::default();
        let a = arena.push(&[1, 2, 3]);
        let b = arena.reserve(5);
        let c = arena.push(&[9; 200]);
        assert_eq!((a.offset, b.offset, c.offset), (0, 128, 256));
        assert_eq!(arena.get(a), &[1, 2, 3]);
        assert_eq!(arena.get(b), &[0; 5]);
        assert_eq!(arena.bytes.len(), 456);
    }
}
