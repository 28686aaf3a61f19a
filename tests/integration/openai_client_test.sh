#!/usr/bin/env bash
# The official openai npm client against `relay serve` (issue 19). Installs
# the client pinned in tests/integration/node/package-lock.json into WORK_DIR
# (npm ci, from the npm registry; again only when the lock file changes),
# then runs node/openai_client_test.mjs from there.
#   tests/integration/openai_client_test.sh RELAY_BINARY SOURCE_DIR WORK_DIR
set -euo pipefail
relay=$1 src=$2 work=$3
node_dir="$src/tests/integration/node"
command -v node >/dev/null && command -v npm >/dev/null ||
  { echo "openai_client_test: node and npm are missing (scripts/setup.sh installs them)" >&2; exit 1; }
mkdir -p "$work"
if ! cmp -s "$node_dir/package-lock.json" "$work/package-lock.json" || [ ! -d "$work/node_modules/openai" ]; then
  cp "$node_dir/package.json" "$node_dir/package-lock.json" "$work/"
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error)
fi
cp "$node_dir/openai_client_test.mjs" "$work/"
exec node "$work/openai_client_test.mjs" "$relay" "$src"
