#!/usr/bin/env bash
# Install the system components the sandbox tests use, where this machine allows it (root + apt-get):
# bubblewrap (Debian package) and tmux (the baseline of the tool benchmark). Without root they are left
# alone and the tests that need them skip, saying why.
set -euo pipefail
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v tmux >/dev/null || missing+=(tmux)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "note: ${missing[*]} not installed (needs root and apt-get); tests that need them will skip" >&2
  exit 0
fi
echo "==> apt-get install ${missing[*]}"
apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
