#!/usr/bin/env bash
# Set everything up and run the test suite (lint first).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh" test
cd "$root"
echo "==> ruff"
.venv/bin/ruff check src tests benchmarks examples
.venv/bin/ruff format --check src tests benchmarks examples
echo "==> pytest"
exec .venv/bin/python -m pytest "$@"
