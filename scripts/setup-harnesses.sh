#!/usr/bin/env bash
# Install the harness presets (docs/harnesses.md), each pinned, under $PRORL_HARNESS_ROOT (default
# ~/.cache/prorl-server/harnesses): npm packages with this machine's npm (Node.js from Debian where it is
# missing and we are root), PyPI ones into a virtual environment each. A no-op for those installed.
# Usage: scripts/setup-harnesses.sh [NAME...]   (default: every preset)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! command -v npm >/dev/null; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "==> apt-get install nodejs npm (for the npm harnesses)"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm >/dev/null
  else
    echo "error: npm is missing (Debian: apt-get install nodejs npm)" >&2
    exit 1
  fi
fi
exec "$root/.venv/bin/python" -m prorl_handlers.harnesses install "$@"
