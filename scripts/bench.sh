#!/usr/bin/env bash
# Runs `laconic bench`: the same driver workload directly against an
# upstream, through Laconic, and through haproxy in TCP mode, in one run.
#
#   scripts/bench.sh [--rust-upstream] [--tls] [--split-cpus] [laconic bench options…]
#
# By default the upstream is the Python SecantusDB of the tests. With
# --rust-upstream it is SecantusDB's Rust server (`secantusd-rs`, built once
# into .upstream/rs with `cargo install`, about 8 minutes on 2 cores), which
# is several times faster and so shows the proxy's own cost more clearly.
# With --tls a tokenizing Laconic serving drivers over TLS is measured too
# (certificates made here with openssl).
# With --split-cpus the upstream runs on the first CPU and the benchmark
# (its driver and every proxy it measures) on the others, as a proxy shares
# its application's host while the database has a host of its own: left to
# the scheduler, the three share every core, and where it places them
# moves the one-client cases by up to a third from run to run (README,
# Benchmarks).
# LACONIC_BIN=PATH measures that build instead of target/release/laconic
# (scripts/build-pgo.sh's, say), without building; `--other-build PATH`
# measures a second build beside it, in turns, in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
rust=false
tls=false
split=false
while true; do
  case "${1:-}" in
    --rust-upstream) rust=true; shift ;;
    --tls) tls=true; shift ;;
    --split-cpus) split=true; shift ;;
    *) break ;;
  esac
done
bash scripts/setup.sh --with-relay
laconic=${LACONIC_BIN:-./target/release/laconic}
if [ -z "${LACONIC_BIN:-}" ]; then
  cargo build --release --locked --bin laconic 2>&1 | tail -1 >&2
fi

source scripts/lib.sh

if $rust; then
  start_rust_upstream
  port=$UPSTREAM_PORT
  up_pid=$UP_PID
  echo "upstream: secantusd-rs on 127.0.0.1:$port" >&2
else
  start_upstream
  port=$UPSTREAM_PORT
  up_pid=$UP_PID
  echo "upstream: secantusd-py on 127.0.0.1:$port" >&2
fi
tls_args=()
if $tls; then
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=bench CA" \
    -keyout "$work/ca.key" -out "$work/ca.pem" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
    -keyout "$work/proxy.key" -out "$work/proxy.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > "$work/san.ext"
  openssl x509 -req -in "$work/proxy.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" \
    -CAcreateserial -days 2 -extfile "$work/san.ext" -out "$work/proxy.pem" 2>/dev/null
  tls_args=(--tls-cert "$work/proxy.pem" --tls-key "$work/proxy.key" --tls-ca "$work/ca.pem")
fi
pin=()
if $split; then
  cpus=$(nproc)
  if [ "$cpus" -lt 2 ]; then
    echo "--split-cpus needs two CPUs; this machine has $cpus" >&2
    exit 2
  fi
  # Every thread the upstream has started, and those it starts later.
  taskset -a -p -c 0 "$up_pid" > /dev/null
  rest=1
  [ "$cpus" -gt 2 ] && rest="1-$((cpus - 1))"
  pin=(taskset -c "$rest")
  echo "cpus: the upstream on 0, the benchmark on $rest" >&2
fi
"${pin[@]}" "$laconic" bench proxy --upstream "mongodb://127.0.0.1:$port/" "${tls_args[@]}" "$@"
