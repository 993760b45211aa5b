#!/usr/bin/env bash
# The checks CI runs before the tests (.ci/run): formatting, clippy with every warning an error (the workspace
# lints in Cargo.toml add a `// SAFETY:` comment on every unsafe block and `unsafe_op_in_unsafe_fn`), clippy on
# the aarch64 NEON kernels (x86 clippy never sees code under cfg(target_arch = "aarch64")), the docs
# without warnings (broken intra-doc links), and first, as it takes no time, the subjects of the commits made
# since the rule came in (tools/commit-subjects.sh: `area: what changed`, at most 72 characters). Run it
# before committing: it only type-checks, so it is quick.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/commit-subjects.sh --self-test
tools/commit-subjects.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
if rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
    cargo clippy -p kazeia-backend-cpu -p kazeia-backend-cpu-plugin --all-targets \
        --target aarch64-unknown-linux-gnu -- -D warnings
else
    echo "lint.sh: no aarch64-unknown-linux-gnu target (tools/deps.sh adds it): its clippy skipped" >&2
fi
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
echo "lint.sh: commit subjects, fmt, clippy and doc clean"
