#!/usr/bin/env bash
# Runs every recipe's test against the sessionbox binary in $SESSIONBOX_BIN (default
# `sessionbox` on PATH). Each test starts its own `serve` (runtime host) on a free port with a
# temporary data directory. No model and no API key of any provider is used.
#
# Two virtual environments (kept under ${XDG_CACHE_HOME:-~/.cache}/sessionbox-recipes, reused):
# langchain-mcp-adapters needs mcp<2, the others use mcp 2.3.0, and neither may change the
# Python that runs the rest of the project's tests. mcp-remote (Claude Desktop's remote entry)
# is installed there with npm. The TypeScript recipe's packages are pinned by
# typescript/package-lock.json and installed there by `npm ci`, with its npm cache in that
# directory too.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

SESSIONBOX_BIN="${SESSIONBOX_BIN:-sessionbox}"
if ! command -v "$SESSIONBOX_BIN" >/dev/null 2>&1; then
  echo "test.sh: sessionbox binary not found: $SESSIONBOX_BIN (set SESSIONBOX_BIN)" >&2
  exit 2
fi
SESSIONBOX_BIN="$(command -v "$SESSIONBOX_BIN")"
export SESSIONBOX_BIN

PYTEST=pytest==9.2.0
MCP2="mcp==2.3.0 openai-agents==0.24.0"
LANGCHAIN="mcp==1.30.0 langchain-mcp-adapters==0.3.2 langchain-core==1.8.3"
MCP_REMOTE=mcp-remote@0.15.1
TS_PACKAGES="$(node -p 'Object.entries(require(process.argv[1]).dependencies)
  .map(e => e.join("@")).join(" ")' "$here/typescript/package.json")"  # from its package.json

cache="${XDG_CACHE_HOME:-$HOME/.cache}/sessionbox-recipes"
mkdir -p "$cache"

venv() {  # venv NAME PACKAGES...: a virtual environment with these packages, printed path
  local dir="$cache/$1"; shift
  [ -x "$dir/bin/python3" ] || python3 -m venv "$dir" >&2
  # shellcheck disable=SC2086
  "$dir/bin/python3" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
    "$@" "$root/sdks/python" >&2
  echo "$dir"
}

echo "== installing (pinned): $PYTEST $MCP2 | $LANGCHAIN | $MCP_REMOTE | $TS_PACKAGES"
# shellcheck disable=SC2086
mcp2="$(venv mcp2 $PYTEST $MCP2)"
# shellcheck disable=SC2086
langchain="$(venv langchain $PYTEST $LANGCHAIN)"
mkdir -p "$cache/npm"
if [ "$(cd "$cache/npm" && node -p 'require("mcp-remote/package.json").version' 2>/dev/null)" != "${MCP_REMOTE#*@}" ]; then
  (cd "$cache/npm" && npm install --no-audit --no-fund --silent "$MCP_REMOTE")
fi
export RECIPES_NPM_DIR="$cache/npm"
(cd "$here/typescript" && npm ci --prefer-offline --cache "$cache/npm-cache" --no-audit --no-fund --silent)

cd "$here"
status=0
echo "== Claude Desktop and Code, OpenAI Agents SDK, Python tool loop, pages (mcp 2.3.0)"
"$mcp2/bin/python3" -m pytest -q -p no:cacheprovider \
  test_claude_configs.py test_openai_agents.py test_tool_loop.py test_pages.py || status=1
echo "== LangChain (langchain-mcp-adapters, mcp 1.30.0)"
"$langchain/bin/python3" -m pytest -q -p no:cacheprovider test_langchain.py || status=1
echo "== TypeScript, official MCP SDK ($TS_PACKAGES, node --test)"
(cd typescript && node --test --test-concurrency=1 sessionbox-mcp.test.mjs) || status=1
exit "$status"
