//! Kazeia's Vulkan compute backend (see README.md): the ops of `kazeia-backend-abi` as compute shaders, weights
//! resident on the device, op lists submitted as one recorded-and-replayed command buffer, a startup self-test of
//! every kernel; ops and weights the device does not take are refused, and the engine runs them on its CPU.
//!
//! Built as a `cdylib` it is the `vulkan` plugin (`src/plugin.rs`); as an `rlib` the tests use
//! [`VulkanBackend`] in-process.

mod backend;
mod context;
mod exec;
mod ops;
mod pipelines;
pub mod plugin;
mod probe;
mod selftest;
mod weights;

pub use backend::{Options, VulkanBackend};
pub use exec::Stats;
pub use ops::{Math, Op};
pub use pipelines::{Activation, Format, GemmMode, Kernel, NormKind};
pub use probe::{vulkan, DeviceInfo, Vulkan};
pub use weights::GpuWeight;
