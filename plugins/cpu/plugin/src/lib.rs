//! The CPU backend as a plugin, `libkazeia_backend_cpu_plugin.so`: this crate holds only the entry symbol. The
//! table and the backend live in the `kazeia-backend-cpu` rlib, which other binaries link too (the engine as its
//! built-in fallback; the Vulkan plugin for its quantisers and self-test, the Hexagon plugin for the row counts
//! its DSP does not take); keeping the symbol out of it means no other binary defines it twice.

kazeia_backend_abi::plugin_entry!(kazeia_backend_cpu::plugin::table());
