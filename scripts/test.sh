#!/usr/bin/env bash
# Set everything up and run the test suite (lint first).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh" test
bash "$root/scripts/system-deps.sh"
# A real Apptainer for the apptainer runtime tests (root only; about 2.5 min the first time, 2 s after).
if [ "$(id -u)" -eq 0 ] && [ -z "${PRORL_APPTAINER:-}" ] && ! command -v apptainer >/dev/null; then
  echo "==> setting up Apptainer under /tmp/apptainer-test (first time: about 2.5 minutes)"
  bash "$root/scripts/setup-apptainer.sh"
fi
if [ -x /tmp/apptainer-test/bin/apptainer ]; then
  export PRORL_APPTAINER="${PRORL_APPTAINER:-/tmp/apptainer-test/bin/apptainer}"
fi
cd "$root"
echo "==> ruff"
.venv/bin/ruff check src tests benchmarks examples handlers
.venv/bin/ruff format --check src tests benchmarks examples handlers
echo "==> pytest"
exec .venv/bin/python -m pytest "$@"
