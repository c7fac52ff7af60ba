#!/usr/bin/env bash
# Podman for the podman runtime tests (root + apt-get: Debian's podman and runc, installed when missing), and
# their image: the Apptainer setup's Debian root filesystem ($IMGROOT, bookworm + python3) imported as
# $PRORL_PODMAN_IMAGE (default localhost/prorl-test:py; about 2 s, once). Exits 3 where it cannot be done.
set -euo pipefail
IMGROOT=${IMGROOT:-/tmp/apptainer-test/imgroot}
IMAGE=${PRORL_PODMAN_IMAGE:-localhost/prorl-test:py}
if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "note: podman/runc not installed (needs root and apt-get); the podman tests will skip" >&2
    exit 3
  fi
  echo "==> apt-get install podman runc"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc >/dev/null  # with its recommends, as tested
fi
if ! podman image exists "$IMAGE"; then
  if [ ! -x "$IMGROOT/usr/bin/python3" ]; then
    echo "note: $IMGROOT (scripts/setup-apptainer.sh makes it) is missing; the podman tests will skip" >&2
    exit 3
  fi
  echo "==> podman import $IMGROOT as $IMAGE"
  tar -C "$IMGROOT" -c . | podman import -q - "$IMAGE" >/dev/null
fi
