#!/usr/bin/env bash
# Set everything up and run the test suite (lint first).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh" test
bash "$root/scripts/system-deps.sh"
# where system-deps.sh can install chromium (root and apt-get), the dashboard test must run, not skip
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  export PRORL_REQUIRE_CHROMIUM=1
fi
# A real Apptainer for the apptainer runtime tests (root only; about 2.5 min the first time, 2 s after).
if [ "$(id -u)" -eq 0 ] && [ -z "${PRORL_APPTAINER:-}" ] && ! command -v apptainer >/dev/null; then
  echo "==> setting up Apptainer under /tmp/apptainer-test (first time: about 2.5 minutes)"
  bash "$root/scripts/setup-apptainer.sh"
fi
if [ -x /tmp/apptainer-test/bin/apptainer ]; then
  export PRORL_APPTAINER="${PRORL_APPTAINER:-/tmp/apptainer-test/bin/apptainer}"
fi
# Podman (Debian's podman + runc) and its test image, imported from the Apptainer setup's root filesystem
# (an apt-get install the first time, then about 2 s to import the image once). As root it must work: a missing
# podman fails its tests.
podman_status=0
bash "$root/scripts/setup-podman.sh" || podman_status=$?
case "$podman_status" in
  0) [ "$(id -u)" -eq 0 ] && export PRORL_REQUIRE_PODMAN=1 ;;
  3) echo "==> the podman tests will be skipped (said above)" ;;
  *) exit "$podman_status" ;;
esac
# Slurm (Debian's slurm-wlm + munge) for the deployment tests on a single-node cluster (tests/test_slurm.py,
# which starts and stops it with scripts/setup-slurm.sh); about 10 s the first time. As root it must work,
# so a missing Slurm fails those tests instead of skipping them.
if [ "$(id -u)" -eq 0 ]; then
  bash "$root/scripts/setup-slurm.sh" install
  export PRORL_REQUIRE_SLURM=1
fi
# The real vLLM (CPU build) for the tests that run against both engines (2-4 minutes the first time,
# a second after). Where it cannot run (not Linux x86_64 with AVX2) those tests skip; elsewhere they must run.
vllm_status=0
bash "$root/scripts/setup-vllm.sh" || vllm_status=$?
case "$vllm_status" in
  0) export PRORL_REQUIRE_VLLM=1 ;;
  3) echo "==> the vLLM tests will be skipped (said above)" ;;
  *) exit "$vllm_status" ;;
esac
cd "$root"
echo "==> ruff"
.venv/bin/ruff check src tests benchmarks examples handlers
.venv/bin/ruff format --check src tests benchmarks examples handlers
echo "==> pytest"
exec .venv/bin/python -m pytest "$@"
