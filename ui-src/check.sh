#!/usr/bin/env bash
# Proves that crates/sessionbox-server/ui/vendor/ is exactly what package-lock.json gives:
# installs the pinned packages with `npm ci` in a temporary directory, runs vendor.mjs into
# another one and compares it with the checked-in directory. Exits 1 on any difference.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
vendor="$here/../crates/sessionbox-server/ui/vendor"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

cp "$here/package.json" "$here/package-lock.json" "$here/vendor.mjs" "$tmp/"
(cd "$tmp" && npm ci --omit=dev --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
node "$tmp/vendor.mjs" --modules "$tmp/node_modules" --out "$tmp/vendor" >/dev/null

if diff -rq "$tmp/vendor" "$vendor"; then
  echo "check.sh: ui/vendor matches package-lock.json"
else
  echo "check.sh: ui/vendor differs from what package-lock.json gives; run 'npm ci && node vendor.mjs' in ui-src/" >&2
  exit 1
fi
