//! The Hexagon plugin's integration tests, one binary: the plugin through the engine's loader, the DSP kernels
//! under the Hexagon simulator, and the conformance suite on the DSP's arithmetic under it.

mod conformance;
mod dsp_qemu;
mod plugin;
