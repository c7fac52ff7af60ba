#!/usr/bin/env bash
# Install the system components the tests use, where this machine allows it (root + apt-get): bubblewrap
# (Debian package) for the sandbox tests, tmux (the baseline of the tool benchmark) and chromium (the
# dashboard test drives it headless; about 15 s to install on top of `apt-get update`). Without root they are
# left alone and the tests that need them skip, saying why.
set -euo pipefail
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v tmux >/dev/null || missing+=(tmux)
command -v chromium >/dev/null || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "note: ${missing[*]} not installed (needs root and apt-get); tests that need them will skip" >&2
  exit 0
fi
echo "==> apt-get install ${missing[*]}"
apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
