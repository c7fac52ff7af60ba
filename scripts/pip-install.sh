# Sourced by the set-up scripts that keep an environment of their own (setup-vllm.sh, setup-verl.sh, setup-verifiers.sh).
# pip_install ARGS...: `pip install ARGS` into $venv, showing how far it got; the whole output goes to
# $home/pip.log, its end shown on failure (the message names $setup_name), which exits with pip's status.
pip_install() {
  local status=0
  "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off "$@" >"$home/pip.log" 2>&1 &
  local pid=$!
  tail -n +1 -f --pid="$pid" "$home/pip.log" | awk '
    /^Collecting / { n++; if (n % 25 == 0) { printf "    %d packages resolved\n", n; fflush() } }
    /^Installing collected packages/ { printf "    installing %d packages\n", n; fflush() }' || true
  wait "$pid" || status=$?
  if [ "$status" -ne 0 ]; then
    echo "$setup_name: pip install $* failed; the end of $home/pip.log:" >&2
    tail -20 "$home/pip.log" >&2
    exit "$status"
  fi
}
