//! Kazeia's Qualcomm Hexagon backend (see README.md).
//!
//! - [`probe`]: `libcdsprpc.so` loaded at run time (never linked), its FastRPC entry points resolved, and a
//!   session opened on the compute DSP; otherwise the precise reason the plugin is unavailable.
//! - [`repack`]: weights in the DSP's layouts (HVX Q8_0/Q4_0 row tiles for matvec, fp16 32×32 tiles for HMX
//!   matmul and im2col convolutions). Pure functions, tested on the host.
//! - [`queue`]: the shared-memory op queue the host writes and the DSP executes (no pointers: buffer id +
//!   offset, since the DSP is 32-bit). `dsp/kazeia_queue.h` is its C side.
//! - [`reference`](mod@reference): what each DSP kernel computes, bit for bit (the qemu-hexagon tests compare against it).
//! - [`backend`]: the `Backend` on a DSP session, with the CPU backend for every op the DSP does not take.
//!
//! Built as a `cdylib` it is the `hexagon` plugin (`src/plugin.rs`).

pub mod backend;
mod fastrpc;
pub mod plugin;
pub mod probe;
pub mod queue;
pub mod reference;
pub mod repack;

pub use backend::HexagonBackend;
