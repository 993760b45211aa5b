#!/usr/bin/env bash
# Builds the CPU backend plugin once per instruction-set level, for installs that ship several builds: the
# loader asks each for its score on the running CPU and uses the best (a build for a level the CPU lacks
# reports itself unavailable). Usage: tools/build_cpu_plugins.sh [OUT_DIR] (default target/plugins).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/plugins}
mkdir -p "$out"
case "$(uname -m)" in
  x86_64) levels="x86-64 x86-64-v3 x86-64-v4" ;;
  aarch64) levels="generic armv8.2" ;;
  *) levels="generic" ;;
esac
for level in $levels; do
  case "$level" in
    armv8.2) flags="-C target-feature=+dotprod" ;;
    generic) flags="" ;;
    *) flags="-C target-cpu=$level" ;;
  esac
  suffix=${level//[^a-z0-9]/_}
  RUSTFLAGS="$flags" cargo build --release -p kazeia-backend-cpu-plugin --target-dir "target/plugin-$suffix"
  cp "target/plugin-$suffix/release/libkazeia_backend_cpu_plugin.so" "$out/libkazeia_backend_cpu_$suffix.so"
  echo "built $out/libkazeia_backend_cpu_$suffix.so ($level)"
done
