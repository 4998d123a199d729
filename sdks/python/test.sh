#!/usr/bin/env bash
# Install the SDK with its test extras, type-check it strictly and run its tests against a real
# `sessionbox serve` (the binary from $SESSIONBOX_BIN, default `sessionbox` on PATH).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

export SESSIONBOX_BIN="${SESSIONBOX_BIN:-sessionbox}"
if ! command -v "$SESSIONBOX_BIN" >/dev/null 2>&1; then
    echo "test.sh: sessionbox binary not found: $SESSIONBOX_BIN (set SESSIONBOX_BIN)" >&2
    exit 2
fi

pip_install() {
    python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore "$@"
}

pip_install "${here}[test]"

echo "== mypy --strict"
python3 -m mypy --strict src/sessionbox tests

echo "== pytest"
# Run from the sources' parent so the tests import the installed package, not a stray copy.
python3 -m pytest -q -p no:cacheprovider tests "$@"
