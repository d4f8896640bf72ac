#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and property tests, and the
# integration tests against a real upstream (SecantusDB, installed and
# started by the tests; or the server named by LACONIC_TEST_UPSTREAM).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo fmt --check
cargo clippy --locked --all-targets -- -D warnings
cargo test --locked
