# Sourced by the scripts: a scratch directory removed on exit, and helpers
# that start an upstream and a proxy which stop when the script ends.

work=$(mktemp -d)
cleanup() { kill $(jobs -p) "${UP_PID:-}" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

# start_upstream: a SecantusDB (Python) on a free port; sets UPSTREAM_PORT.
start_upstream() {
  coproc UP { exec .upstream/venv/bin/python scripts/upstream.py; }
  read -r _ UPSTREAM_PORT <&"${UP[0]}"
  UP_PID=$!
}

# start_proxy BINARY [serve options…]: laconic on a free port; sets PROXY_ADDR.
start_proxy() {
  local bin=$1
  shift
  "$bin" serve --listen 127.0.0.1:0 "$@" > "$work/proxy.out" &
  until grep -q "listening on" "$work/proxy.out"; do sleep 0.1; done
  PROXY_ADDR=$(sed -n 's/^listening on //p' "$work/proxy.out")
}
