#!/usr/bin/env bash
# Instructions the proxy runs per operation, counted by callgrind: a figure
# a shared machine does not disturb, to compare two builds or two commits
# where CPU time per operation moves by more than the difference between
# them (README, "Where the proxy's time goes"). The benchmark's operations,
# with pymongo, through a pass-through and a tokenizing proxy in front of
# the tests' SecantusDB (or, with --rust-upstream, its Rust server, as in
# scripts/bench.sh); the count starts after a warm-up and is divided by
# the operations run (a cursor read is 1,000 documents). It takes in the
# name store's refresh, once a second: the faster the upstream, the less
# of it per operation. Slow: the proxy runs under valgrind, so a few
# minutes in all.
#
#   scripts/instructions.sh [--rust-upstream]         # target/release/laconic, built first
#   scripts/instructions.sh [--rust-upstream] BINARY  # another build, as it is
#   OPS="cursor find_one" N=40 scripts/instructions.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rust=false
if [ "${1:-}" = --rust-upstream ]; then
  rust=true
  shift
fi
bash scripts/setup.sh
if ! command -v valgrind >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "instructions: installing valgrind" >&2
    apt-get update -qq >/dev/null && apt-get install -y -qq valgrind >/dev/null
  else
    echo "instructions: needs valgrind (callgrind)" >&2
    exit 1
  fi
fi
bin=${1:-}
if [ -z "$bin" ]; then
  cargo build --release --locked --bin laconic >&2
  bin=target/release/laconic
fi
ops=${OPS:-cursor find_one insert_one update_one insert_many}

source scripts/lib.sh
if $rust; then start_rust_upstream; else start_upstream; fi
upstream="mongodb://127.0.0.1:$UPSTREAM_PORT/"
printf '[proxy.tokenize]\nmin_len = 1\nstore_db = "laconic_instructions_store"\n' > "$work/tokenizing.toml"
: > "$work/pass-through.toml"

# count CONFIG OPERATION N: instructions per operation, in $counted. Each
# proxy has a database of its own: the tokenizing one refuses to write
# into a database that holds documents but no dictionary.
count() {
  local config=$1 op=$2 n=$3
  rm -f "$work"/cg.*
  valgrind --tool=callgrind --callgrind-out-file="$work/cg.%p" \
    "$bin" serve --listen 127.0.0.1:0 --upstream "$upstream" --config "$work/$config.toml" \
    > "$work/proxy.out" 2> "$work/valgrind.out" &
  local pid=$!
  until grep -q "listening on" "$work/proxy.out"; do sleep 0.2; done
  local addr
  addr=$(sed -n 's/^listening on //p' "$work/proxy.out")
  rm -f "$work/to" "$work/from"
  mkfifo "$work/to" "$work/from"
  .upstream/venv/bin/python scripts/instructions_workload.py "mongodb://$addr/" "$op" "$n" \
    "laconic_instructions_${config//-/_}" \
    < "$work/to" > "$work/from" &
  local driver=$! line
  exec 7> "$work/to" 8< "$work/from"
  read -r line <&8
  callgrind_control -z "$pid" > /dev/null 2>&1
  echo go >&7
  read -r line <&8
  callgrind_control -d "$pid" > /dev/null 2>&1
  echo end >&7
  exec 7>&- 8<&-
  wait "$driver"
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  local total
  total=$(callgrind_annotate "$work"/cg.*.1 2>/dev/null | awk '/PROGRAM TOTALS/ && !n { gsub(",", "", $1); print $1; n = 1 }')
  [ -n "$total" ] || { echo "instructions: no count for $op through the $config proxy" >&2; exit 1; }
  counted=$((total / n))
}

printf '%-12s %14s %14s\n' operation pass-through tokenizing
for op in $ops; do
  n=${N:-$([ "$op" = cursor ] && echo 60 || echo 100)}
  count pass-through "$op" "$n"
  plain=$counted
  count tokenizing "$op" "$n"
  printf '%-12s %14s %14s\n' "$op" "$plain" "$counted"
done
