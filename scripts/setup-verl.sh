#!/usr/bin/env bash
# Install verl (PyPI's verl 0.9.1, with torch 2.13.0 for the CPU) and prorl-server in an environment of
# their own, for prorl-server's verl agent loop (src/prorl_server/training/verl_agent_loop.py) and its test
# (tests/training/test_verl_agent_loop.py). The server's .venv gets none of it.
#
#   bash scripts/setup-verl.sh        # about 6 minutes the first time (363 s on 2 shared cores), about 30 s after that (importing verl to check it)
#
# Where: $PRORL_VERL_HOME (default ~/.cache/prorl-server/verl): venv/. Remove it to start over.
# verl's own dependencies (ray, transformers, tensordict, hydra, ...) install on a CPU machine; it pulls no
# vLLM and no flash-attn (those are a GPU run's, installed by the user with verl's extras). prorl-server
# goes in editable (its plain dependencies, no extras), so the agent loop is this checkout's.
# Needs Python 3.11 ($PYTHON, default python3: the CPU build of torch 2.13.0 is for 3.11) and PyPI.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
home="${PRORL_VERL_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/prorl-server/verl}"
python="${PYTHON:-python3}"
verl_version="0.9.1"
venv="$home/venv"
stamp="$venv/.prorl-installed-verl-$verl_version"
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }

if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  echo "setup-verl: needs Python 3.11 (the CPU build of torch 2.13.0 is for 3.11); set PYTHON=/path/to/python3.11" >&2
  exit 3
fi
mkdir -p "$home"

setup_name=setup-verl
# shellcheck source=scripts/pip-install.sh
source "$root/scripts/pip-install.sh"

if [ ! -f "$stamp" ]; then
  echo "==> installing verl $verl_version into $venv (first time: about 6 minutes)"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  pip_install "verl==$verl_version" "torch==2.13.0"
  # verl 0.9.1 imports cachetools (verl/workers/rollout/router.py, reached by its agent loop) without
  # declaring it
  pip_install cachetools
  touch "$stamp"
  echo "    installed in $(elapsed)"
fi
# prorl-server itself, editable (fast once its dependencies are there); again whenever the checkout moved
if ! "$venv/bin/python" -c "import prorl_server, sys; sys.exit(not prorl_server.__file__.startswith('$root/'))" 2>/dev/null; then
  echo "==> installing prorl-server ($root) into $venv"
  pip_install -e "$root"
fi
"$venv/bin/python" - <<'PY'
import torch
import verl
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput  # noqa: F401
from verl.protocol import DataProto  # noqa: F401

print(f"    verl {verl.__version__}, torch {torch.__version__}")
PY
echo "==> verl ready: $venv ($(elapsed))"
