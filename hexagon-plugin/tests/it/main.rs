//! The Hexagon plugin's integration tests, one binary: the plugin through the engine's loader, and the
//! DSP kernels under the Hexagon simulator.

mod dsp_qemu;
mod plugin;
