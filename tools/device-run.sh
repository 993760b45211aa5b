#!/usr/bin/env bash
# On a lent GPU machine (see tools/device-pack.sh, run here first): the Vulkan plugin's kernel and decoder tests
# on the real GPU, and `kazeia bench` on the GPU and on the machine's CPU at 1, 2, 4 and 8 threads (0.6B q4_0
# random weights). About 4 minutes; each result also goes to $OUT (or /tmp/device-out).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/device-out}
mkdir -p "$out"
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
# The test binaries name their fixtures by this checkout's path on the machine that built them.
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=$PWD/.dev/lib CARGO=/bin/true
k=.dev/kazeia
t=.dev/t/release/deps
echo "== machine"
lscpu | grep -E 'Model name|^CPU\(s\)|L3'
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
echo "== backends"
timeout 60 $k backends --plugin-path "$PWD/.dev" 2>&1 | tee "$out/backends.txt"
if grep -q '^vulkan.*: available' "$out/backends.txt"; then
  echo "== vulkan tests"
  timeout 90 $t/vk_it kernels:: 2>&1 | grep -E '^test |test result|panicked' | tee "$out/vk_kernels.txt"
  timeout 120 $t/vk_it decoder:: 2>&1 | grep -E '^test |test result|panicked' | tee "$out/vk_decoder.txt"
  echo "== vulkan bench"
  timeout 120 $k bench --random 0.6b --weights q4_0 --frames 8 --repeat 1 --backend vulkan \
    --plugin-path "$PWD/.dev" 2>&1 | tee "$out/vk_q4_0.txt"
else
  VK_LOADER_DEBUG=error,warn timeout 60 $k backends --plugin-path "$PWD/.dev" 2>&1 | tail -20
fi
for n in 1 2 4 8; do
  echo "== cpu bench, $n thread(s)"
  timeout 90 $k bench --random 0.6b --weights q4_0 --threads $n --frames 16 --repeat 2 2>&1 |
    tee "$out/cpu_q4_0_$n.txt" | grep -E '^(talker|code|decoder total|RTF|streaming: first)'
done
