#!/usr/bin/env bash
# Installs every Debian package Kazeia's build and tests need; does nothing when all are present.
# Idempotent; uses sudo when not root. Run by .ci/run; run it yourself on a fresh Debian 12 machine.
set -euo pipefail

packages=(
    build-essential pkg-config
    # pipewire-sys: bindgen needs libclang, system-deps finds libpipewire-0.3 through pkg-config
    libclang-dev libpipewire-0.3-dev
    # headless audio in tests: PipeWire, its session manager, the PulseAudio server for speech-dispatcher
    pipewire pipewire-bin wireplumber pipewire-pulse
    # private session buses in tests; busctl (systemd) as a real D-Bus client
    dbus-daemon dbus-bin systemd
    sox
    speech-dispatcher
    # the Debian package's check (daemon/cli/tests/it/install.rs): what a distribution's archive would report
    lintian
    # Orca end to end (daemon/tests/it/orca.rs): Orca under Xvfb with the AT-SPI bus, a GTK 3 window from
    # Python (tests/gtk_window.py), key presses through XTEST
    orca xvfb at-spi2-core python3-gi gir1.2-gtk-3.0 xdotool
    # Vulkan backend tests on lavapipe
    mesa-vulkan-drivers libvulkan1
    # Hexagon plugin: HVX kernels built by clang --target=hexagon (lld links) and run under qemu-hexagon
    clang lld qemu-user
)

# aarch64 cross build and its tests under qemu (tools/build-aarch64.sh, tools/test-aarch64.sh); on an ARM host
# or with KAZEIA_NO_CROSS=1 nothing is added.
if [ "$(uname -m)" = x86_64 ] && [ -z "${KAZEIA_NO_CROSS:-}" ]; then
    "$(dirname "$0")/deps-aarch64.sh"
fi

# Installed for this machine's architecture (or arch-independent): with multiarch, a name alone also matches
# the arm64 copy deps-aarch64.sh installs (libpipewire-0.3-dev:arm64 would hide a missing amd64 one).
native=$(dpkg --print-architecture)
missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status} ${Architecture}\n' "$p" 2>/dev/null |
        grep -Eq "^install ok installed ($native|all)\$"; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "deps.sh: all ${#packages[@]} packages are installed"
    exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    sudo=(sudo)
fi
echo "deps.sh: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
