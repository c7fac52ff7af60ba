#!/usr/bin/env bash
# Set everything up and watch a model learn through prorl-server on the CPU: GRPO on SmolLM2-135M-Instruct,
# the real vLLM reloading the new weights after every step (examples/train_grpo.py; docs/trainers.md).
#
#   bash scripts/train.sh                          # 16 steps, about 10 minutes on 2 cores
#   bash scripts/train.sh --steps 30 --loss tis --plot curve.png --json history.json
#
# Needs what the quickstart needs, plus the `train` extra in .venv (torch 2.13.0, transformers, TRL,
# matplotlib: about a minute the first time). The real vLLM is required: the dev engine cannot reload weights.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
status=0
bash "$root/scripts/setup-vllm.sh" || status=$?
if [ "$status" -eq 3 ]; then
  echo "the learning demo needs the real vLLM, which reloads the trained weights (said above why it cannot run here)" >&2
  exit 3
elif [ "$status" -ne 0 ]; then
  exit "$status"
fi
bash "$root/scripts/bootstrap.sh" train
exec "$root/.venv/bin/python" "$root/examples/train_grpo.py" "$@"
