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
# llama.cpp (the dev engine) builds for the CPU it is built on by default, with every instruction set the CPU
# advertises; a VM that advertises AMX but does not let processes use it then kills the engine with SIGILL at
# its first request. So it is built for the instruction sets listed below, never AMX (unless CMAKE_ARGS is set).
llama_flags() {
  local flags="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  if grep -qw avx2 /proc/cpuinfo 2>/dev/null; then flags+=" -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"; fi
  if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then flags+=" -DGGML_AVX512=ON"; fi
  echo "$flags"
}
if [ "$(uname -m)" = x86_64 ] && [ -z "${CMAKE_ARGS:-}" ]; then
  CMAKE_ARGS="$(llama_flags)"
  export CMAKE_ARGS
fi
"$root/.venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$target" -e "$root/handlers"
# A llama-cpp-python built natively before (pip's wheel cache keeps it) may use AMX: build it again as above.
if [ "$(uname -m)" = x86_64 ] && "$root/.venv/bin/python" -c "
import sys, llama_cpp
sys.exit(0 if b'AMX_INT8 = 1' in llama_cpp.llama_print_system_info() else 1)" 2>/dev/null; then
  version=$("$root/.venv/bin/python" -c "import llama_cpp; print(llama_cpp.__version__)")
  echo "    (llama-cpp-python $version was built with AMX, which this machine may not run: building it again"
  echo "     without it, about 5 minutes on 2 cores)"
  "$root/.venv/bin/python" -m pip cache remove llama_cpp_python >/dev/null 2>&1 || true
  "$root/.venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
      "llama-cpp-python==$version"
fi
