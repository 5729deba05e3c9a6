#!/usr/bin/env bash
# Installs the S7 peer gateways (idempotent), under .bench-peers/ in the checkout (ignored by
# git; ~800 MB): nginx-light (apt), LiteLLM proxy (PyPI venv in .bench-peers/venvs/litellm),
# Portkey gateway (npm in .bench-peers/node). BENCH_VENVS / BENCH_NODE choose other places.
set -euo pipefail
PEERS="$(cd "$(dirname "$0")/../.." && pwd)/.bench-peers"
VENVS=${BENCH_VENVS:-$PEERS/venvs}
NODE_DIR=${BENCH_NODE:-$PEERS/node}
if ! command -v nginx >/dev/null; then
  apt-get install -y -qq nginx-light || { apt-get update -qq && apt-get install -y -qq nginx-light; }
fi
if [ ! -x "$VENVS/litellm/bin/litellm" ]; then
  mkdir -p "$VENVS"
  python3 -m venv "$VENVS/litellm"
  "$VENVS/litellm/bin/pip" install -q 'litellm[proxy]'
fi
if [ ! -f "$NODE_DIR/node_modules/@portkey-ai/gateway/build/start-server.js" ]; then
  mkdir -p "$NODE_DIR"
  [ -f "$NODE_DIR/package.json" ] || echo '{"name":"bench-node","private":true}' > "$NODE_DIR/package.json"
  (cd "$NODE_DIR" && npm install --no-audit --no-fund @portkey-ai/gateway)
fi
echo "nginx: $(nginx -v 2>&1)"
echo "litellm: $("$VENVS/litellm/bin/pip" show litellm 2>/dev/null | sed -n 's/^Version: //p')"
echo "portkey: $(node -p "require('$NODE_DIR/node_modules/@portkey-ai/gateway/package.json').version")"
