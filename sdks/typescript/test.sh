#!/usr/bin/env bash
# Installs the pinned dependencies, type-checks and builds the SDK, and runs its tests against a
# real `sessionbox serve` started by the tests (binary: $SESSIONBOX_BIN, default `sessionbox`).
#
#   SESSIONBOX_BIN=/path/to/sessionbox sdks/typescript/test.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"

export SESSIONBOX_BIN="${SESSIONBOX_BIN:-sessionbox}"
if ! command -v "$SESSIONBOX_BIN" >/dev/null 2>&1; then
  echo "test.sh: sessionbox binary not found: $SESSIONBOX_BIN (set SESSIONBOX_BIN)" >&2
  exit 1
fi
echo "test.sh: node $(node --version), npm $(npm --version), $("$SESSIONBOX_BIN" --version)"

npm ci --no-audit --no-fund
rm -rf dist build
# The generated types must be what openapi-typescript makes of the checked-in document.
before=$(mktemp)
trap 'rm -f "$before"' EXIT
cp src/generated/openapi.ts "$before"
npm run --silent generate
if ! cmp -s "$before" src/generated/openapi.ts; then
  echo "test.sh: src/generated/openapi.ts differs from what \`npm run generate\` makes; commit the regenerated file" >&2
  exit 1
fi
npm run typecheck
npm run build
npm run build:test   # type-checks the tests against the built dist/ (they import "sessionbox")
# The library must not depend on Node: tsconfig.json type-checks it without @types/node (so a
# Node global such as Buffer or process does not compile); and no module of node: in dist/.
if grep -rnE "from \"node:|import\(\"node:|require\(" dist/ --include='*.js'; then
  echo "test.sh: dist/ uses a Node-only API" >&2
  exit 1
fi
node --test --test-concurrency=1 build/*.test.js
