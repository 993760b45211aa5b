#!/usr/bin/env bash
# Cross-builds the whole product for aarch64-unknown-linux-gnu (64-bit ARM Linux: Raspberry Pi 5, RK3588,
# Snapdragon) into target/aarch64-unknown-linux-gnu/release: kazeiad, kazeia, sd_kazeia (PipeWire included),
# the Vulkan and Hexagon plugins, and the CPU plugin once per ARM level (tools/build_cpu_plugins.sh) in
# target/aarch64-unknown-linux-gnu/release/plugins. Needs what tools/deps-aarch64.sh installs.
# On an ARM board build natively instead: `cargo build --release` (see README, "ARM boards").
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/aarch64-env.sh
triple=aarch64-unknown-linux-gnu
out=target/$triple/release
cargo build --release --target $triple -p kazeia -p kazeiad -p kazeia-speechd \
    -p kazeia-backend-vulkan -p kazeia-backend-hexagon -p kazeia-backend-cpu-plugin
CARGO_BUILD_TARGET=$triple tools/build_cpu_plugins.sh "$out/plugins"
ls -l "$out"/kazeia "$out"/kazeiad "$out"/sd_kazeia "$out"/libkazeia_backend_*.so "$out"/plugins/*.so
