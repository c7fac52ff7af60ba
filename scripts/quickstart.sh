#!/usr/bin/env bash
# Set everything up and run the quickstart: a real LLM on the CPU, a prorl-server with the first-party
# handlers, 16 math rollouts with IPython in bubblewrap sandboxes.
#
#   bash scripts/quickstart.sh                 # the real vLLM where it runs (Linux x86_64), else the dev engine
#   bash scripts/quickstart.sh --engine dev    # the dev engine (llama.cpp) in any case
# Other options go to examples/quickstart.py (--problems, --samples, --max-turns, --max-tokens).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
engine=auto
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) engine="${2:?--engine needs vllm, dev or auto}"; shift 2 ;;
    --engine=*) engine="${1#--engine=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
case "$engine" in auto|vllm|dev) ;; *) echo "--engine must be vllm, dev or auto, not $engine" >&2; exit 2 ;; esac

if [ "$engine" != dev ]; then
  status=0
  bash "$root/scripts/setup-vllm.sh" || status=$?
  if [ "$status" -eq 0 ]; then
    engine=vllm
  elif [ "$status" -eq 3 ] && [ "$engine" = auto ]; then
    echo "==> the real vLLM cannot run here (said above): falling back to the dev engine (llama.cpp)"
    engine=dev
  else
    exit "$status"
  fi
fi
if [ "$engine" = dev ]; then
  bash "$root/scripts/bootstrap.sh" devllm
else
  bash "$root/scripts/bootstrap.sh"
fi
bash "$root/scripts/system-deps.sh" bubblewrap   # the sandboxes; not the tests' tmux and chromium
exec "$root/.venv/bin/python" "$root/examples/quickstart.py" --engine "$engine" ${args[@]+"${args[@]}"}
