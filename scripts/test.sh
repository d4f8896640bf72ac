#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and property tests, and the
# integration tests against a real upstream (SecantusDB, installed and
# started by the tests; or the server named by LACONIC_TEST_UPSTREAM).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo fmt --check
cargo clippy --locked --all-targets -- -D warnings
cargo test --locked --no-run

# The longest test, the migration of 50,000 documents under load (on
# SecantusDB's Python server, more than half of the tests' time), runs from
# the start in a process of its own, beside the rest, which run one at a
# time: two tests at a time in all, as `cargo test` runs them on two cores,
# but the longest no longer starts halfway through and ends last.
long=migrate::a_collection_migrates_under_load_resumes_after_a_kill_and_reverses_byte_for_byte
log=$(mktemp)
cargo test --locked --test it -- --exact "$long" > "$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2> /dev/null || true; rm -f "$log"' EXIT
status=0
cargo test --locked -- --test-threads=1 --skip "$long" || status=$?
wait "$pid" || status=$?
echo "== $long"
cat "$log"
exit "$status"
