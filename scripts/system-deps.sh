#!/usr/bin/env bash
# Install system packages where this machine allows it (root + apt-get), those named or by default all the tests
# use: bubblewrap (Debian package) for the sandbox tests, tmux (the baseline of the tool benchmark) and chromium
# (the dashboard test drives it headless; about 15 s to install on top of `apt-get update`). Without root they
# are left alone, and what needs them skips (a test) or falls back (the quickstart's sandboxes), saying why.
#
#   bash scripts/system-deps.sh               # bubblewrap, tmux and chromium (scripts/test.sh)
#   bash scripts/system-deps.sh bubblewrap    # only bubblewrap (scripts/quickstart.sh)
set -euo pipefail
packages=("$@")
[ ${#packages[@]} -gt 0 ] || packages=(bubblewrap tmux chromium)
missing=()
for package in "${packages[@]}"; do
  case "$package" in
    bubblewrap) command -v bwrap >/dev/null || missing+=(bubblewrap) ;;
    tmux|chromium) command -v "$package" >/dev/null || missing+=("$package") ;;
    *) echo "system-deps.sh: unknown package $package (known: bubblewrap, tmux, chromium)" >&2; exit 2 ;;
  esac
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "note: ${missing[*]} not installed (needs root and apt-get); what needs them will skip or fall back" >&2
  exit 0
fi
echo "==> apt-get install ${missing[*]}"
apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
