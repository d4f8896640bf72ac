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

# start_rust_upstream: SecantusDB's Rust server (built once into .upstream/rs,
# about 10 minutes), several times faster than the Python one, on a free
# port; sets UPSTREAM_PORT and UP_PID.
start_rust_upstream() {
  if [ ! -x .upstream/rs/bin/secantusd-rs ]; then
    command -v cmake >/dev/null || apt-get install -y -qq cmake >/dev/null
    cargo install --locked --ignore-rust-version --root .upstream/rs --version 0.5.3-beta.196 secantus-mdb
  fi
  .upstream/rs/bin/secantusd-rs --host 127.0.0.1 --port 0 --storage-path "$work/data" --cache-size 1G \
    > "$work/up.out" 2>&1 &
  UP_PID=$!
  until grep -q "listening on" "$work/up.out"; do sleep 0.1; done
  UPSTREAM_PORT=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$work/up.out" | head -1)
}

# start_proxy BINARY [serve options…]: laconic on a free port; sets PROXY_ADDR.
start_proxy() {
  local bin=$1
  shift
  "$bin" serve --listen 127.0.0.1:0 "$@" > "$work/proxy.out" &
  until grep -q "listening on" "$work/proxy.out"; do sleep 0.1; done
  PROXY_ADDR=$(sed -n 's/^listening on //p' "$work/proxy.out")
}
