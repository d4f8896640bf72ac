#!/usr/bin/env bash
# Installs what Laconic's tests, demo and benchmarks need, idempotently:
# the SecantusDB upstream and pymongo in .upstream/venv, and haproxy (the TCP
# relay the benchmark compares against) when apt is available.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.upstream/venv
SECANTUS_VERSION="0.7.0b3"

if [ ! -x "$VENV/bin/secantusd-py" ] || ! "$VENV/bin/python" -c "import pymongo, backports.zstd, snappy" 2>/dev/null; then
  echo "setup: installing SecantusDB $SECANTUS_VERSION and pymongo into $VENV" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check \
    "SecantusDB==$SECANTUS_VERSION" "pymongo>=4.9,<5" "backports.zstd" "python-snappy"
fi

if [ "${1:-}" = "--with-relay" ] && ! command -v haproxy >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "setup: installing haproxy (benchmark relay)" >&2
    apt-get update -qq >/dev/null && apt-get install -y -qq haproxy >/dev/null
  else
    echo "setup: haproxy not installed; the benchmark will skip the relay" >&2
  fi
fi
