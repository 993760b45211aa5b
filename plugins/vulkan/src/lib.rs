//! Kazeia Vulkan backend plugin: not yet implemented (see README.md).
