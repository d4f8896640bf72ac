#!/usr/bin/env bash
# Quick start: installs what is needed, builds Laconic, starts a SecantusDB
# upstream and the proxy in front of it, runs a short driver workload through
# the proxy, and reports what was stored. Everything it starts stops with it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "building laconic (release)…" >&2
cargo build --release --locked --bin laconic 2>&1 | tail -1 >&2

work=$(mktemp -d)
cleanup() { kill $(jobs -p) "${UP_PID:-}" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

coproc UP { exec .upstream/venv/bin/python scripts/upstream.py; }
read -r _ port <&"${UP[0]}"
UP_PID=$!
echo "upstream: SecantusDB on 127.0.0.1:$port" >&2

./target/release/laconic serve --listen 127.0.0.1:0 --upstream "mongodb://127.0.0.1:$port/" \
  --log-level warn > "$work/proxy.out" &
until grep -q "listening on" "$work/proxy.out"; do sleep 0.1; done
proxy=$(sed -n 's/^listening on //p' "$work/proxy.out")
echo "laconic:  $proxy → 127.0.0.1:$port" >&2

.upstream/venv/bin/python scripts/demo_workload.py "mongodb://$proxy/?retryWrites=false" \
  "mongodb://127.0.0.1:$port/?directConnection=true"
