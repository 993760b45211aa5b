#!/usr/bin/env bash
# Builds the CPU backend plugin once per instruction-set level, for installs that ship several builds: the
# loader asks each for its score on the running CPU and uses the best (a build for a level the CPU lacks
# reports itself unavailable, with the reason). Usage: tools/build_cpu_plugins.sh [OUT_DIR] (default
# target/plugins). With CARGO_BUILD_TARGET=aarch64-unknown-linux-gnu (tools/build-aarch64.sh) it cross-builds
# the ARM levels.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/plugins}
mkdir -p "$out"
triple=${CARGO_BUILD_TARGET:-}
arch=${triple%%-*}
arch=${arch:-$(uname -m)}
case "$arch" in
  x86_64) levels="x86-64 x86-64-v3 x86-64-v4" ;;
  # ARMv8.0 (Cortex-A53/A72, Pi 4), ARMv8.2 dotprod + fp16 (Cortex-A55/A76: Pi 5, RK3588), ARMv8.6 i8mm + bf16
  # (Cortex-A710/X2 and later, Neoverse V1/N2). Exactly these features, which the plugin checks at load.
  aarch64) levels="armv8.0 armv8.2 armv8.6" ;;
  *) levels="generic" ;;
esac
for level in $levels; do
  case "$level" in
    armv8.0 | generic) flags="" ;;
    armv8.2) flags="-C target-feature=+dotprod,+fp16" ;;
    armv8.6) flags="-C target-feature=+dotprod,+fp16,+i8mm,+bf16" ;;
    *) flags="-C target-cpu=$level" ;;
  esac
  suffix=${level//[^a-z0-9]/_}
  # A level without extra flags is the ordinary build: share its target directory.
  dir=target/plugin-$suffix
  [ -n "$flags" ] || dir=target
  RUSTFLAGS="$flags" cargo build --release -p kazeia-backend-cpu-plugin --target-dir "$dir"
  cp "$dir/$triple/release/libkazeia_backend_cpu_plugin.so" "$out/libkazeia_backend_cpu_$suffix.so"
  echo "built $out/libkazeia_backend_cpu_$suffix.so ($level)"
done
