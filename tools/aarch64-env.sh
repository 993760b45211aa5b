# Sourced by tools/build-aarch64.sh and tools/test-aarch64.sh: the environment cargo needs to cross-build for
# aarch64-unknown-linux-gnu on a Debian amd64 host (tools/deps-aarch64.sh installs the parts) and to run the
# results under qemu-aarch64.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
# pipewire-sys: pkg-config reads the arm64 (multiarch) .pc files only, and bindgen's clang parses the headers
# as aarch64 with the cross C library's headers.
export PKG_CONFIG_ALLOW_CROSS=1
export PKG_CONFIG_LIBDIR_aarch64_unknown_linux_gnu=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR_aarch64_unknown_linux_gnu=/
export BINDGEN_EXTRA_CLANG_ARGS_aarch64_unknown_linux_gnu="--target=aarch64-linux-gnu -isystem /usr/aarch64-linux-gnu/include"
# cargo test/run for the target executes through qemu-user. The loader and C library are the multiarch arm64
# ones (libc6:arm64, which libpipewire-0.3-dev:arm64 brings): with QEMU_LD_PREFIX=/usr/aarch64-linux-gnu the
# cross package's ld.so would pick up the multiarch libc.so.6 of another build and hang at the first thread.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=qemu-aarch64
export QEMU_LD_PREFIX=/
