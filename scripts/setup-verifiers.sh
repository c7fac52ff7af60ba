#!/usr/bin/env bash
# Install verifiers 0.4.0 with prorl-server and prorl-handlers in an environment of their own, for the verifiers
# handler's tests (tests/handlers/test_env_verifiers.py, which tests/handlers/test_env_verifiers_venv.py runs
# in this venv). The tests' .venv gets none of it: verifiers 0.4 pins openai<3, the test extra has openai 3.
#
#   bash scripts/setup-verifiers.sh   # about 3 minutes the first time (168 s on 2 shared cores), about 12 s after that (importing verifiers to check it)
#                                     # and a minute where the checkout moved (pip builds both editable installs again)
#
# Where: $PRORL_VERIFIERS_HOME (default ~/.cache/prorl-server/verifiers): venv/. Remove it to start over.
# prorl-server and prorl-handlers go in editable from this checkout (their plain dependencies, no extras; again
# whenever the checkout moved), beside what that test file and tests/conftest.py need to run: pytest with
# pytest-asyncio and pytest-timeout (pyproject's asyncio_mode and timeout), nothing else.
# Needs Python 3.11 or newer ($PYTHON, default python3) and PyPI.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
home="${PRORL_VERIFIERS_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/prorl-server/verifiers}"
python="${PYTHON:-python3}"
verifiers_version="0.4.0"
venv="$home/venv"
stamp="$venv/.prorl-installed-verifiers-$verifiers_version"
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }

if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))' 2>/dev/null; then
  echo "setup-verifiers: needs Python 3.11 or newer (prorl-server's); set PYTHON=/path/to/python3.11" >&2
  exit 3
fi
mkdir -p "$home"

setup_name=setup-verifiers
# shellcheck source=scripts/pip-install.sh
source "$root/scripts/pip-install.sh"

# Everything in one resolution, so that pip weighs verifiers' pins (openai<3, ...) against prorl-server's
# dependencies; the same call when the checkout moved (what is there already is kept).
install_all() {
  pip_install "verifiers==$verifiers_version" "pytest>=8" "pytest-asyncio>=0.23" "pytest-timeout>=2.2" \
    -e "$root" -e "$root/handlers"
}
if [ ! -f "$stamp" ]; then
  echo "==> installing verifiers $verifiers_version into $venv (first time: about 3 minutes)"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  install_all
  touch "$stamp"
  echo "    installed in $(elapsed)"
fi
# prorl-server and prorl-handlers are this checkout's (editable): installed again whenever the checkout moved
if ! "$venv/bin/python" -c "
import sys, prorl_server, prorl_handlers
sys.exit(not all(m.__file__.startswith('$root/') for m in (prorl_server, prorl_handlers)))" 2>/dev/null; then
  echo "==> installing prorl-server and prorl-handlers ($root) into $venv"
  install_all
fi
"$venv/bin/python" - <<'PY'
from importlib.metadata import version

import openai
import pytest  # noqa: F401
import pytest_asyncio  # noqa: F401
import pytest_timeout  # noqa: F401
import verifiers.v1  # noqa: F401

from prorl_handlers.verifiers_env import VerifiersHandler  # noqa: F401

print(f"    verifiers {version('verifiers')}, openai {openai.__version__}, pytest {version('pytest')}")
PY
echo "==> verifiers ready: $venv ($(elapsed))"
