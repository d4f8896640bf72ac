#!/usr/bin/env bash
# Builds Laconic with profile-guided optimization: an instrumented build
# serves the training workload (scripts/pgo_workload.py: the benchmark's
# operations, through a pass-through and a tokenizing proxy, in front of
# the tests' SecantusDB), and the release build is then optimized by what
# it ran (README, "Where the proxy's time goes"). About twice a release
# build's time; needs rustup's llvm-tools (installed here).
#
#   scripts/build-pgo.sh        # prints the binary's path: target/pgo/release/laconic
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
rustup component add llvm-tools >&2
profdata=$(find "$(rustc --print sysroot)" -name llvm-profdata -type f | head -1)
[ -x "$profdata" ] || { echo "build-pgo: llvm-profdata not found" >&2; exit 1; }

source scripts/lib.sh
data="$PWD/target/pgo-data"
rm -rf "$data"
# The target directories are apart: the flags differ from a plain build's.
RUSTFLAGS="-Cprofile-generate=$data" \
  cargo build --release --locked --bin laconic --target-dir target/pgo-generate >&2
# Build scripts ran instrumented too: only the proxy's profiles count.
rm -rf "$data"

start_upstream
upstream="mongodb://127.0.0.1:$UPSTREAM_PORT/"
printf '[proxy.tokenize]\nmin_len = 1\nstore_db = "laconic_pgo_store"\n' > "$work/tokenizing.toml"
: > "$work/pass-through.toml"
for config in tokenizing pass-through; do
  start_proxy target/pgo-generate/release/laconic --upstream "$upstream" --config "$work/$config.toml"
  proxy_pid=$!
  echo "build-pgo: training through a $config proxy" >&2
  .upstream/venv/bin/python scripts/pgo_workload.py "mongodb://$PROXY_ADDR/"
  # A clean exit writes the profile.
  kill -TERM "$proxy_pid"
  wait "$proxy_pid"
done
"$profdata" merge -o "$data/merged.profdata" "$data"/*.profraw

# LACONIC_BUILD names the build in `laconic --version` and
# `laconic_build_info`.
RUSTFLAGS="-Cprofile-use=$data/merged.profdata" LACONIC_BUILD=pgo \
  cargo build --release --locked --bin laconic --target-dir target/pgo >&2
echo target/pgo/release/laconic
