//! The CPU backend as a plugin, `libkazeia_backend_cpu_plugin.so`: this crate holds only the entry symbol. The
//! table and the backend live in the `kazeia-backend-cpu` rlib, which the engine and the Vulkan and Hexagon
//! plugins link as their CPU fallback; keeping the symbol out of it means no other binary defines it twice.

kazeia_backend_abi::plugin_entry!(kazeia_backend_cpu::plugin::table());
