#!/usr/bin/env bash
# Builds the Debian package of Kazeia (kazeia_VERSION_ARCH.deb) from binaries already built, with plain
# dpkg-deb: no debhelper, no network. The files are laid out by `kazeia install --prefix /usr --destdir`,
# so the package and a system install put every file in the same place:
#   /usr/bin/{kazeia,kazeiad}, /usr/lib/kazeia/plugins/*.so, /usr/lib/speech-dispatcher-modules/sd_kazeia,
#   /etc/speech-dispatcher/modules/kazeia.conf, /etc/kazeia/kazeia.toml,
#   /usr/lib/systemd/user/kazeia.service, /usr/share/dbus-1/services/org.kazeia.Speech{,.Provider}.service,
#   /usr/share/dbus-1/interfaces/{org.kazeia.Speech1,org.freedesktop.Speech.Provider}.xml
#
# Usage: tools/make-deb.sh [--target-dir DIR] [--plugins DIR] [--out DIR] [--arch amd64|arm64]
#                          [--compress xz|gzip|none] [--no-strip]
#   --target-dir  where kazeia, kazeiad, sd_kazeia and the libkazeia_backend_*.so plugins are
#                 (default target/release; for arm64 the cross build's, e.g. tools/build-aarch64.sh's
#                 target/aarch64-unknown-linux-gnu/release)
#   --plugins     more plugins to ship, e.g. tools/build_cpu_plugins.sh's per-ISA builds (default
#                 target/plugins when it exists and the target dir is target/release)
#   --out         where the .deb goes (default target/debian)
#   --arch        default: read from kazeiad's ELF header
#   KAZEIA=PATH   the `kazeia` that lays out the files; it must run here (default: the target dir's when
#                 it is this machine's architecture, else target/release/kazeia or target/debug/kazeia)
#
# Example: cargo build --release && tools/build_cpu_plugins.sh && tools/make-deb.sh
#          sudo apt install ./target/debian/kazeia_0.1.0_amd64.deb
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
target_dir=$root/target/release
out=$root/target/debian
plugins=
arch=
compress=xz
strip=1
while [ $# -gt 0 ]; do
    case "$1" in
        --target-dir) target_dir=$2; shift 2 ;;
        --plugins) plugins=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --arch) arch=$2; shift 2 ;;
        --compress) compress=$2; shift 2 ;;
        --no-strip) strip=0; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "make-deb.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
target_dir=$(cd "$target_dir" && pwd)
if [ -z "$plugins" ] && [ "$target_dir" = "$root/target/release" ] && [ -d "$root/target/plugins" ]; then
    plugins=$root/target/plugins
fi

for bin in kazeia kazeiad sd_kazeia; do
    if [ ! -f "$target_dir/$bin" ]; then
        echo "make-deb.sh: $target_dir/$bin is missing: build first (cargo build --release)" >&2
        exit 1
    fi
done

# The ELF machine field (offset 18, little endian): 0x3e x86-64, 0xb7 AArch64.
elf_arch() {
    case "$(od -An -tx1 -j18 -N2 "$1" | tr -d ' \n')" in
        3e00) echo amd64 ;;
        b700) echo arm64 ;;
        *) echo unknown ;;
    esac
}
[ -n "$arch" ] || arch=$(elf_arch "$target_dir/kazeiad")
case "$arch" in
    amd64) strip_tool=x86_64-linux-gnu-strip ;;
    arm64) strip_tool=aarch64-linux-gnu-strip ;;
    *) echo "make-deb.sh: unsupported architecture '$arch' (amd64 or arm64)" >&2; exit 1 ;;
esac
host_arch=$(dpkg --print-architecture)

kazeia=${KAZEIA:-}
if [ -z "$kazeia" ]; then
    for candidate in "$target_dir/kazeia" "$root/target/release/kazeia" "$root/target/debug/kazeia"; do
        if [ -x "$candidate" ] && [ "$(elf_arch "$candidate")" = "$host_arch" ]; then
            kazeia=$candidate
            break
        fi
    done
fi
if [ -z "$kazeia" ]; then
    echo "make-deb.sh: no kazeia for $host_arch to lay out the files: cargo build --release -p kazeia -p kazeiad" >&2
    exit 1
fi

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$root/Cargo.toml")
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
"$kazeia" install --prefix /usr --destdir "$stage" --from "$target_dir" \
    --speechd-module-dir /usr/lib/speech-dispatcher-modules >/dev/null
if [ -n "$plugins" ]; then
    mkdir -p "$stage/usr/lib/kazeia/plugins"
    cp "$plugins"/libkazeia_backend_*.so "$stage/usr/lib/kazeia/plugins/"
fi

if [ "$strip" = 1 ]; then
    command -v "$strip_tool" >/dev/null || { [ "$arch" = "$host_arch" ] && strip_tool=strip; }
    if command -v "$strip_tool" >/dev/null; then
        find "$stage/usr" -type f \( -path '*/bin/*' -o -name '*.so' -o -name 'sd_kazeia' \) \
            -exec "$strip_tool" --strip-debug {} +
    else
        echo "make-deb.sh: no $strip_tool: the binaries keep their debug information" >&2
    fi
fi

mkdir -p "$stage/DEBIAN"
(cd "$stage" && find etc -type f | sed 's|^|/|' | sort) > "$stage/DEBIAN/conffiles"
installed_size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat > "$stage/DEBIAN/control" <<EOF
Package: kazeia
Version: $version
Architecture: $arch
Maintainer: Kazeia developers <dev@kazeia.invalid>
Installed-Size: $installed_size
Depends: libc6 (>= 2.36), libgcc-s1, libpipewire-0.3-0 (>= 0.3.65)
Recommends: speech-dispatcher (>= 0.11), pipewire, pipewire-pulse, dbus-user-session, libvulkan1
Section: sound
Priority: optional
Description: local neural speech daemon (Qwen3-TTS) for screen readers
 Kazeia keeps a Qwen3-TTS-12Hz model resident and warm and serves speech over
 D-Bus (its own API and the Spiel provider interface) and speech-dispatcher
 (the output module sd_kazeia, so spd-say and Orca use it), playing through
 PipeWire. The daemon starts on the first D-Bus call (user unit kazeia.service).
EOF

# What to run next, said once at install; the user's own speech-dispatcher settings are left alone.
cat > "$stage/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -z "$2" ]; then
    echo "kazeia: each user gets the voice model with 'kazeia model download' (it shows the size first;"
    echo "kazeia: the daemon downloads nothing by itself), then chooses Kazeia in Orca or runs 'kazeia say Hello'."
fi
exit 0
EOF
chmod 755 "$stage/DEBIAN/postinst"

mkdir -p "$out"
deb=$out/kazeia_${version}_${arch}.deb
dpkg-deb --root-owner-group -Z"$compress" --build "$stage" "$deb" >/dev/null
echo "$deb"
