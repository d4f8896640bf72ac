#!/usr/bin/env bash
# Records proto/*.lcap from real driver traffic: pymongo and the Node.js
# driver each run a short workload through `laconic serve --capture`, and the
# capture of the connection that carried the workload is kept.
# The workloads drop their database first, so a capture replays the same way
# against any fresh upstream (tests/it/capture.rs replays them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build -q --bin laconic
source scripts/lib.sh
start_upstream
start_proxy ./target/debug/laconic --upstream "mongodb://127.0.0.1:$UPSTREAM_PORT/" \
  --capture "$work/cap" --log-level warn
proxy=$PROXY_ADDR

keep() { # keep the capture whose session ran a find, as proto/$1.lcap
  for f in "$work"/cap/*.lcap; do
    if python3 - "$f" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
sys.exit(0 if b"find\x00" in data else 1)
PY
    then cp "$f" "proto/$1.lcap"; echo "recorded proto/$1.lcap ($(wc -c < "$f") bytes)"; fi
  done
  rm -f "$work"/cap/*.lcap
}

.upstream/venv/bin/python tests/py/capture_workload.py "mongodb://$proxy/?retryWrites=false&maxPoolSize=1"
sleep 0.5; keep pymongo-crud

if command -v npm >/dev/null; then
  (cd "$work" && npm init -y >/dev/null && npm install --silent mongodb@6 >/dev/null)
  NODE_PATH="$work/node_modules" node tests/js/capture_workload.js "mongodb://$proxy/?retryWrites=false&maxPoolSize=1"
  sleep 0.5; keep node-crud
fi
