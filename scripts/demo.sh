#!/usr/bin/env bash
# Quick start: installs what is needed, builds Laconic, starts a SecantusDB
# upstream and the proxy in front of it, runs a short driver workload through
# the proxy, and reports what was stored. Everything it starts stops with it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "building laconic (release)…" >&2
cargo build --release --locked --bin laconic 2>&1 | tail -1 >&2

source scripts/lib.sh
start_upstream
echo "upstream: SecantusDB on 127.0.0.1:$UPSTREAM_PORT" >&2
start_proxy ./target/release/laconic --upstream "mongodb://127.0.0.1:$UPSTREAM_PORT/" --log-level warn \
  --tokenize-min-len 6 --custom-path custom --value-path top_artists
echo "laconic:  $PROXY_ADDR → 127.0.0.1:$UPSTREAM_PORT" >&2

.upstream/venv/bin/python scripts/demo_workload.py "mongodb://$PROXY_ADDR/?retryWrites=false" \
  "mongodb://127.0.0.1:$UPSTREAM_PORT/?directConnection=true"
