#!/usr/bin/env bash
# Fuzz campaigns, one target after another (not run in CI):
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET…]
#   scripts/fuzz.sh --runs N [TARGET…]      (N executions per target)
# Targets: decode_roundtrip (the codec), walker, roundtrip (tokenize then
# expand), request (every catalogue command), reply (expansion). Corpora
# are seeded from the BSON fixtures; findings land in fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
limit="-max_total_time=${1:-600}"
if [ "${1:-}" = "--runs" ]; then limit="-runs=$2"; shift; fi
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(decode_roundtrip walker roundtrip request reply)

command -v cargo-fuzz > /dev/null || cargo install cargo-fuzz --locked
toolchain=+nightly
rustup toolchain list | grep -q '^nightly' || toolchain=""   # then RUSTC_BOOTSTRAP below

# Seeds: every JSON fixture as BSON (for request, behind a command-picking byte).
.upstream/venv/bin/python - <<'PY'
import glob, json, os, bson
docs = []
for path in sorted(glob.glob("tests/fixtures/*.json")):
    with open(path) as f:
        value = json.load(f)
    docs.extend(value if isinstance(value, list) else [value])
docs += [
    {"filter": {"first_name": {"$in": ["x"]}, "$or": [{"address.location": 1}]}, "sort": {"amount": -1}},
    {"updates": [{"q": {"first_name": 1}, "u": {"$set": {"custom.New One": 2}}}]},
    {"pipeline": [{"$match": {"amount": {"$gt": 1}}}, {"$group": {"_id": "$first_name", "n": {"$sum": 1}}}]},
    # An insert of documents of one layout: those after the first are
    # tokenized by the layout of the one before.
    {"insert": "c", "documents": [{"_id": i, "first_name": "x", "custom": {"Favorite Player": i, "k": [i, {"last_name": 2}]},
                                   "tags": ["a"]} for i in range(4)]},
    # A cursor's batch of one layout, its keys one-byte tokens: documents
    # after the first are expanded by the layout of the one before.
    {"cursor": {"firstBatch": [{"_id": i, "\x02": "x", "\x04": {"\x06": [i, 2]}, "tags": ["a"]}
                               for i in range(4)], "id": 0, "ns": "app.c"}, "ok": 1.0},
    # One of documents of one level: followed as one stream.
    {"cursor": {"firstBatch": [{"\x02": f"user-{i}", "_id": i, "\x04": i * 7, "\x06": ["a", "b"]}
                               for i in range(4)], "id": 0, "ns": "app.c"}, "ok": 1.0},
]
for target in ("walker", "roundtrip", "request", "reply"):
    os.makedirs(f"fuzz/corpus/{target}", exist_ok=True)
    for i, d in enumerate(docs):
        if not isinstance(d, dict):
            continue
        data = bson.encode(d)
        if target == "request":
            data = bytes([i % 256]) + data
        with open(f"fuzz/corpus/{target}/seed-{i}", "wb") as f:
            f.write(data)
PY

for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$t"
  echo "== $t: $limit"
  (cd fuzz && RUSTC_BOOTSTRAP=1 cargo $toolchain fuzz run "$t" "corpus/$t" -- \
      "$limit" -rss_limit_mb=2048 -print_final_stats=1 2>&1) \
    | tee "/tmp/laconic-fuzz-$t.log" | grep -E "^Done|stat::number_of_executed_units|SUMMARY|crash-" || true
done
