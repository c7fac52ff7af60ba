#!/usr/bin/env bash
# Create .venv (if missing) and install prorl-server into it with the given extras (e.g. `bootstrap.sh test`),
# plus the first-party handlers (handlers/, a plugin distribution like any third party's).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
"$python" - <<'PY' || { echo "prorl-server needs Python >= 3.11 (set PYTHON=/path/to/python3.11)" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY
if [ ! -x "$root/.venv/bin/python" ]; then
  echo "==> creating $root/.venv"
  "$python" -m venv "$root/.venv"
fi
extras="${1:-}"
target="$root"
[ -n "$extras" ] && target="$root[$extras]"
echo "==> installing prorl-server${extras:+ [$extras]} and its handlers into .venv"
"$root/.venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
case ",$extras," in
  *,devllm,*|*,test,*)
    if ! "$root/.venv/bin/python" -c "import llama_cpp" 2>/dev/null; then
      echo "    (the dev engine's llama-cpp-python is built from source the first time: about 5 minutes on 2 cores;"
      echo "     pip keeps the built wheel, later installs take seconds)"
    fi
    ;;
esac
case ",$extras," in
  *,train,*|*,test,*)
    # the trainer's torch first, pinned to the release vLLM's CPU build uses (its CPU wheel where the machine
    # has one), so the extra's `torch>=2.4` does not pull a newer, larger build
    echo "    (the trainer's side: torch 2.13.0, transformers and TRL)"
    "$root/.venv/bin/python" -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
    ;;
esac
"$root/.venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$target" -e "$root/handlers"
