//! The Vulkan plugin's integration tests, one binary: one module per subject, `common` the fixtures
//! they share. `fallback` is its own binary: it sets the process's environment.

mod common;

mod decoder;
mod kernels;
mod plugin;
mod spirv;
mod tensor_ids;
