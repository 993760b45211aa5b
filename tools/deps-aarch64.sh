#!/usr/bin/env bash
# Installs what the aarch64 cross build and its emulated tests need (tools/build-aarch64.sh,
# tools/test-aarch64.sh): the Rust target, the cross compiler and C library, qemu-user, and the arm64 (Debian
# multiarch) development packages that pipewire-sys links against. Idempotent; sudo when not root. Called by
# tools/deps.sh.
set -euo pipefail

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    sudo=(sudo)
fi

if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
    rustup target add aarch64-unknown-linux-gnu
fi

packages=(
    gcc-aarch64-linux-gnu libc6-dev-arm64-cross binutils-aarch64-linux-gnu qemu-user
    # pipewire-sys for the target: headers and libpipewire-0.3.so for arm64, found by pkg-config
    libpipewire-0.3-dev:arm64
)

if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    "${sudo[@]}" dpkg --add-architecture arm64
fi

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "deps-aarch64.sh: all ${#packages[@]} packages are installed"
    exit 0
fi
echo "deps-aarch64.sh: installing ${missing[*]}"
"${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"
