#!/usr/bin/env bash
# Packs what tools/device-run.sh needs on a lent GPU machine (x86-64, no network, no cargo): stripped release
# builds of `kazeia`, the Vulkan and CPU plugins and the Vulkan plugin's kernel and decoder tests under `.dev/`,
# the PipeWire client library `kazeia` links, and Debian's Vulkan loader and glvnd packages under `.gl/` (the
# NVIDIA driver's Vulkan library needs them). Both folders are git-ignored through .git/info/exclude; name them
# in the device tool's `carry`, then run `bash tools/device-run.sh` there.
set -euo pipefail
cd "$(dirname "$0")/.."
for d in /.gl/ /.dev/; do
  grep -qxF "$d" .git/info/exclude || echo "$d" >>.git/info/exclude
done
cargo build --release -p kazeia -p kazeia-backend-vulkan -p kazeia-backend-cpu-plugin
# The crate's tests are one binary (tests/it); device-run.sh runs its kernels:: and decoder:: modules.
it=$(cargo test --release -p kazeia-backend-vulkan --no-run --test it 2>&1 |
  sed -n 's/.*Executable tests\/it\/main\.rs (\(.*\))/\1/p')
rm -rf .dev && mkdir -p .dev/lib .dev/t/release/deps .dev/t/plugin-for-tests/debug
cp target/release/kazeia target/release/libkazeia_backend_vulkan.so .dev/
# The tests build their plugins with cargo into target/plugin-for-tests/debug next to target/<profile>/deps:
# the same layout, and CARGO=/bin/true on the device, make them find these.
cp target/release/libkazeia_backend_vulkan.so target/release/libkazeia_backend_cpu_plugin.so \
  .dev/t/plugin-for-tests/debug/
cp "$it" .dev/t/release/deps/vk_it
cp "$(ldconfig -p | sed -n 's/.*libpipewire-0\.3\.so\.0 .*=> //p' | head -1)" .dev/lib/
find .dev -type f ! -name '*.sh' -exec strip {} + 2>/dev/null || true
mkdir -p .gl /tmp/device-apt/partial
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/device-apt'
apt-get $o update >/dev/null
(cd .gl && apt-get $o download libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2 2>&1 | grep -v '^W:' || true)
du -sh .dev .gl
