#!/usr/bin/env bash
# Regenerates the committed SPIR-V in spv/ from the GLSL sources here, and spv/SOURCES.cksum (POSIX cksum of
# every source) that the crate's tests compare with the sources, so a shader edited without rerunning this
# script fails CI even where no shader compiler is installed. Needs glslangValidator (Debian: glslang-tools).
#
# Usage: plugins/vulkan/shaders/build.sh [OUTPUT_DIR]   (default: spv/ beside this script)
set -euo pipefail
cd "$(dirname "$0")"
out="${1:-spv}"
mkdir -p "$out"

compile() { # compile SOURCE OUTPUT [DEFINES...]
    local src="$1" dst="$2"
    shift 2
    local log
    if ! log=$(glslangValidator -V --target-env vulkan1.1 "$@" -o "$out/$dst" "$src" 2>&1); then
        echo "$log" >&2
        exit 1
    fi
}

# Shaders with a workgroup reduction come twice: with subgroup arithmetic and with shared memory only.
for shader in matvec norm attention; do
    compile "$shader.comp" "${shader}_subgroup.spv" -DSUBGROUP=1
    compile "$shader.comp" "${shader}_shared.spv" -DSUBGROUP=0
done
for shader in gemm depthwise eltwise rope strided; do
    compile "$shader.comp" "$shader.spv"
done

if [ "$out" = spv ]; then
    cksum ./*.comp ./*.glsl | sed 's| \./| |' >spv/SOURCES.cksum
fi
