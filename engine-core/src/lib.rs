//! Kazeia's model runtime for the Qwen3-TTS-12Hz family.
//!
//! Model code in this crate says *what* is computed as ops on a [`graph::Graph`] (a stage at a time, handed to a
//! [`Backend`] as one list); backends (the CPU one is always linked in) say *how*.

pub mod allocator;
pub mod codec;
pub mod codes;
pub mod error;
pub mod fallback;
pub mod graph;
pub mod host_conv;
pub mod hub;
pub mod hub_cache;
pub mod linear;
pub mod lm;
pub mod marks;
pub mod mel;
pub mod plugins;
pub mod random_weights;
pub mod speaker_encoder;
pub mod stream;
pub mod synth;
pub mod tokenizer;
pub mod voice_clone;
pub mod wav;
pub mod weight_cache;
pub mod weights;
pub mod weights_auto;

pub use error::{Error, Result};
pub use kazeia_backend_abi::{Backend, WeightFormat};
pub use kazeia_backend_cpu::{ConvPrecision, CpuBackend};
pub use linear::WeightStorage;
