#!/usr/bin/env bash
# Set everything up and run the quickstart: the dev engine (a real small LLM on the CPU), a prorl-server with
# the first-party handlers, 16 math rollouts with IPython in bubblewrap sandboxes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh" devllm
bash "$root/scripts/system-deps.sh"
exec "$root/.venv/bin/python" "$root/examples/quickstart.py" "$@"
