#!/usr/bin/env bash
# The dashboard's checks and browser tests, against the sessionbox binary in $SESSIONBOX_BIN
# (default `sessionbox` on PATH):
#   1. check.sh: ui/vendor/ is exactly what package-lock.json gives;
#   2. npm ci: the pinned packages, playwright-core included (it downloads no browser);
#   3. node --test: unit tests of the page's pure modules, then the page in Debian's Chromium
#      ($CHROMIUM, default /usr/bin/chromium; installed with apt-get when missing and root).
# UI_DEV=1 runs the browser tests against a binary that does not serve /ui/ yet (see README.md).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

SESSIONBOX_BIN="${SESSIONBOX_BIN:-sessionbox}"
if ! command -v "$SESSIONBOX_BIN" >/dev/null 2>&1; then
  echo "test.sh: sessionbox binary not found: $SESSIONBOX_BIN (set SESSIONBOX_BIN)" >&2
  exit 2
fi
SESSIONBOX_BIN="$(command -v "$SESSIONBOX_BIN")"
export SESSIONBOX_BIN

CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$CHROMIUM" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing Debian's chromium"
    apt-get install -y -q chromium >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
  else
    echo "test.sh: no Chromium at $CHROMIUM: apt-get install chromium, or set CHROMIUM" >&2
    exit 2
  fi
fi
export CHROMIUM

echo "== check.sh: ui/vendor against package-lock.json"
bash "$here/check.sh"

echo "== npm ci"
(cd "$here" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)

echo "== tests (binary: $SESSIONBOX_BIN${UI_DEV:+, UI_DEV=$UI_DEV})"
cd "$here"
node --test --test-concurrency=1 test/units.test.mjs test/dashboard.test.mjs
