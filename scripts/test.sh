#!/usr/bin/env bash
# Set everything up and run the test suite (lint first).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh" test
# verl's and verifiers' own environments install beside the steps below (pip spends most of its time downloading
# and unpacking), each in a process group of its own
verl_log="$(mktemp -t prorl-setup-verl.XXXXXX)"
setsid bash "$root/scripts/setup-verl.sh" >"$verl_log" 2>&1 &
verl_pid=$!
verifiers_log="$(mktemp -t prorl-setup-verifiers.XXXXXX)"
setsid bash "$root/scripts/setup-verifiers.sh" >"$verifiers_log" 2>&1 &
verifiers_pid=$!
# a step below failing stops both too (their process groups); one trap for the two, cleared once both are waited for
trap 'kill -- -"$verl_pid" 2>/dev/null || true; kill -- -"$verifiers_pid" 2>/dev/null || true' EXIT
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
# Slurm (Debian's slurm-wlm + munge, and iproute2 where `ip` is missing) for the deployment tests on a
# single-node cluster (tests/launch/test_slurm.py) and a 3-node one in network namespaces (tests/launch/test_slurm_multinode.py),
# which start and stop them with scripts/setup-slurm.sh; about 10 s the first time. As root it must work, so a
# missing Slurm fails those tests instead of skipping them.
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
# The harness presets' programs (Claude Code, Codex, OpenCode from npm; mini-swe-agent, Harbor's Terminus from
# PyPI), pinned, for tests/harnesses/test_harness_*.py: about 3.5 minutes the first time, nothing after. They must run.
echo "==> harnesses"
bash "$root/scripts/setup-harnesses.sh"
export PRORL_REQUIRE_HARNESSES=1
# verl 0.9.1 in an environment of its own, for tests/training/test_verl_agent_loop.py (about 6 minutes the first
# time, seconds after; started beside the other set-up steps above, waited for here). It must run.
echo "==> verl (its output: $verl_log)"
if ! wait "$verl_pid"; then
  echo "scripts/setup-verl.sh failed:" >&2
  tail -30 "$verl_log" >&2
  exit 1
fi
export PRORL_REQUIRE_VERL=1
# verifiers 0.4.0 in an environment of its own (it pins openai<3, .venv has openai 3), for
# tests/handlers/test_env_verifiers.py, which tests/handlers/test_env_verifiers_venv.py runs there as a nested
# pytest (about 3 minutes the first time, seconds after; started beside verl's). It must run.
echo "==> verifiers (its output: $verifiers_log)"
if ! wait "$verifiers_pid"; then
  echo "scripts/setup-verifiers.sh failed:" >&2
  tail -30 "$verifiers_log" >&2
  exit 1
fi
trap - EXIT
export PRORL_REQUIRE_VERIFIERS=1
cd "$root"
echo "==> ruff"
.venv/bin/ruff check src tests benchmarks examples handlers
.venv/bin/ruff format --check src tests benchmarks examples handlers
# In one process by default. PRORL_TEST_WORKERS=N runs N pytest-xdist workers, tests sharing an exclusive thing
# (the real vLLM, Podman, the Slurm clusters, the harness programs, image builds) on one worker each (see
# tests/conftest.py): worth it on a machine with more cores. On 2 cores, 3 workers took as long as one process
# (56 against 53 minutes) and starved the real vLLM's start past its 300 s.
# The 25 slowest tests are listed at the end (where the suite's time goes; a later --durations wins).
# A test that fails runs once more (pytest-rerunfailures) before it counts as failed: the real components (vLLM,
# Podman, Slurm, image builds) share 2 cores with the suite, and a load spike once made a 120 s wait run out.
# A rerun is never silent: it is an R in the progress line, and the summary counts it ("N rerun"); a test that
# fails twice fails the run. PRORL_TEST_RERUNS=0 turns this off.
workers="${PRORL_TEST_WORKERS:-0}"
reruns="${PRORL_TEST_RERUNS:-1}"
echo "==> pytest ($workers workers, $reruns rerun(s) of a failed test)"
if [ "$workers" = "0" ]; then
  exec .venv/bin/python -m pytest --durations=25 --reruns "$reruns" --reruns-delay 5 "$@"
fi
exec .venv/bin/python -m pytest -n "$workers" --dist loadgroup --durations=25 --reruns "$reruns" --reruns-delay 5 "$@"
