#!/usr/bin/env bash
# The aarch64 part of CI (.ci/run): cross-builds the product (tools/build-aarch64.sh), then under qemu-aarch64
#  1. the CPU backend's tests with QEMU_CPU = cortex-a53 (ARMv8.0: NEON only), cortex-a76 (dotprod, fp16) and
#     max (i8mm, bf16): every NEON/SDOT/SMMLA/FMLA .8h kernel against its scalar definition, and a check that
#     the CPU model offers exactly the kernels expected, so each dispatch path really runs;
#  2. the engine's parity tests on the committed fixtures (greedy codes identical to the official ones,
#     decoder within 1e-4, streamed = one-shot, the same samples with and without SSML marks), and the
#     decoder's distance from the f64 truth on the tiny fixtures on each CPU model;
#  3. the CPU plugin built per ARM level, loaded by `kazeia backends` on each CPU model: a level the CPU lacks
#     is unavailable with the reason, and the best available build scores highest (the loader takes it);
#  4. the arm64 Debian package made from the cross build (tools/make-deb.sh), checked by lintian.
# Needs what tools/deps-aarch64.sh installs. Tests run as release builds: they reuse the cross build.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/aarch64-env.sh
triple=aarch64-unknown-linux-gnu
start=$SECONDS
step() { echo "test-aarch64: $* ($((SECONDS - start)) s)"; }

step "cross build"
tools/build-aarch64.sh

models=(cortex-a53:neon cortex-a76:neon,dotprod max:neon,dotprod,i8mm)
for m in "${models[@]}"; do
    step "CPU kernels on ${m%%:*}"
    # FEAT_FP16 (the fast decoder's f16 1×1 convolutions): ARMv8.2 and later, not the A53.
    fp16=1
    [ "${m%%:*}" != cortex-a53 ] || fp16=0
    QEMU_CPU=${m%%:*} KAZEIA_EXPECT_ARM_KERNELS=${m#*:} KAZEIA_EXPECT_ARM_FP16=$fp16 \
        cargo test --release --target $triple -p kazeia-backend-cpu
done

step "engine parity (cortex-a76)"
# The plugin case builds a plugin with a nested host cargo; step 3 loads the cross-built plugins instead.
QEMU_CPU=cortex-a76 cargo test --release --target $triple -p kazeia-engine \
    --test it -- lm_parity:: codec_parity:: stream_session:: marks:: --skip through_the_plugin
# The decoder's accuracy contract against the f64 truth on each CPU model (the released-shape fixtures take
# minutes of emulation each: x86 runs them).
for m in "${models[@]}"; do
    step "decoder vs the f64 truth on ${m%%:*}"
    QEMU_CPU=${m%%:*} cargo test --release --target $triple -p kazeia-engine --test it -- \
        codec_truth:: --skip released_decoder
done

step "plugin levels"
kazeia=target/$triple/release/kazeia
plugins=$PWD/target/$triple/release/plugins  # absolute: relative plugin folders are ignored
# model: level expected to win, and the levels expected unavailable with their reason
levels=(
    "cortex-a53 armv8_0 armv8_2:lacks.dotprod armv8_6:lacks.dotprod"
    "cortex-a76 armv8_2 armv8_6:lacks.i8mm"
    "max armv8_6"
)
for spec in "${levels[@]}"; do
    read -r model best unavailable <<<"$spec"
    listing=$(QEMU_CPU=$model qemu-aarch64 "$kazeia" backends --plugin-path "$plugins" | grep /plugins/libkazeia_backend_cpu_)
    echo "$listing"
    for u in $unavailable; do
        echo "$listing" | grep -E "backend_cpu_${u%%:*}\.so\): unavailable — .*${u#*:}" >/dev/null ||
            { echo "test-aarch64: on $model the ${u%%:*} build should be unavailable (${u#*:})" >&2; exit 1; }
    done
    top=$(echo "$listing" | sed -n 's/.*backend_cpu_\([a-z0-9_]*\)\.so): available, score \([0-9]*\).*/\2 \1/p' |
        sort -n | tail -1 | cut -d' ' -f2)
    [ "$top" = "$best" ] ||
        { echo "test-aarch64: on $model the best CPU build is $top, expected $best" >&2; exit 1; }
done

# The arm64 Debian package from this build (a host `kazeia` lays it out and writes its manual pages), checked
# as a distribution's archive would check it.
step "arm64 Debian package"
cargo build -q -p kazeia
deb=$(tools/make-deb.sh --target-dir target/$triple/release --plugins "$plugins" --out target/debian-arm64 \
    --compress gzip)
lintian --fail-on error,warning "$deb"
echo "test-aarch64: $deb: lintian reports no error or warning"
step "done"
