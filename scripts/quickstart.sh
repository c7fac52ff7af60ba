#!/usr/bin/env bash
# Set everything up and run the quickstart: a prorl-server, an LLM backend, 16 multi-turn rollouts.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
exec "$root/.venv/bin/python" "$root/examples/quickstart.py" "$@"
