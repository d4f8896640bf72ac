#!/usr/bin/env bash
# A random differential campaign (not run in CI): seeds of random operations
# through tokenizing proxies in four configurations, each against an
# untokenized twin database on the same upstream (tests/py/random_differential.py says what is drawn
# and compared).
#
#   scripts/explore.sh [SEEDS] [OPS] [FIRST]
#
# (default: 50 seeds of 400 operations, from seed 1; a later FIRST explores
# seeds no earlier campaign drew).
#
# The proxies tokenize every name; names of 4 bytes or more with custom
# attributes (at custom, and at address.location: a rule of two parts) and
# three value paths (location.city: two parts); and names of 6 bytes or more,
# with custom attributes at items (which holds arrays of documents) and at
# nested.meta, and values at city and level (so that short names left as they
# are meet tokens in the same documents); and the last policy again on two
# proxies of one name store, which take the operations in turns, where the
# database and another one share a dictionary (a group), so that `$out` and
# `$merge` into the other database are drawn too and rewritten. The upstream is a SecantusDB started
# here, or the server LACONIC_TEST_UPSTREAM names (a real mongod, say).
# Prints each seed's summary and every difference; exits 1 if any.
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-50}
ops=${2:-400}
first=${3:-1}
bash scripts/setup.sh
cargo build --release --locked --bin laconic 2>&1 | tail -1 >&2

source scripts/lib.sh

if [ -n "${LACONIC_TEST_UPSTREAM:-}" ]; then
  upstream=$LACONIC_TEST_UPSTREAM
else
  start_upstream
  upstream="mongodb://127.0.0.1:$UPSTREAM_PORT/"
fi
direct="$upstream"
case "$direct" in *\?*) direct="$direct&directConnection=true" ;; *) direct="$direct?directConnection=true" ;; esac

every=(--tokenize-min-len 1 --store-db laconic_explore_all)
values=(--tokenize-min-len 4 --custom-path custom --custom-path address.location --value-path tags --value-path productCategory
  --value-path location.city --store-db laconic_explore_values)
mixed=(--tokenize-min-len 6 --custom-path items --custom-path nested.meta --value-path city --value-path level
  --store-db laconic_explore_mixed)
# The group's databases: the runs of the fourth configuration all use the
# prefix explore_g, and the group's dictionary lives on from seed to seed.
cat > "$work/group.toml" <<EOF
[[proxy.tokenize.dictionaries]]
databases = ["explore_g_proxy", "explore_g_proxy_o"]
home = "explore_g_home"
EOF
group=(--config "$work/group.toml" "${mixed[@]/laconic_explore_mixed/laconic_explore_group}")
addrs=()
proxies=(every values mixed group group)
for i in "${!proxies[@]}"; do
  declare -n options=${proxies[$i]}
  ./target/release/laconic serve --listen 127.0.0.1:0 --upstream "$upstream" --no-metrics "${options[@]}" \
    > "$work/$i.out" 2> "$work/$i.log" &
  until grep -q "listening on" "$work/$i.out"; do sleep 0.1; done
  addrs+=("$(sed -n 's/^listening on //p' "$work/$i.out")")
done

failed=0
for seed in $(seq "$first" $((first + seeds - 1))); do
  for i in 0 1 2 3; do
    if [ "$i" = 3 ]; then
      run=(explore_g "$seed" "$ops" wide cross "mongodb://${addrs[4]}/?retryWrites=false")
    else
      run=("explore_${i}_$seed" "$seed" "$ops" wide)
    fi
    out=$(.upstream/venv/bin/python tests/py/random_differential.py \
      "mongodb://${addrs[$i]}/?retryWrites=false" "$direct" "${run[@]}" 2>&1) || true
    echo "$out" | grep -v "^refused" | sed "s/^/[${addrs[$i]}] /"
    echo "$out" | grep -q " 0 mismatches, .*final state same" || failed=1
  done
done
exit $failed
