#!/bin/bash
# setup.sh - install a REAL Apptainer (Debian sid package, 1.4.x) on a Debian bookworm
# host WITHOUT touching the host root filesystem: it lives in a sid rootfs and is
# called through the wrapper $BASE/bin/apptainer (written below).
# Run as root. Only deb.debian.org is needed. Re-runnable: finished steps are skipped
# (rm -rf the corresponding directory to redo one).
set -euo pipefail
#
# Copied from the team recipe (shared recipes/apptainer/setup.sh, with NOTES.md and smoke.py beside it);
# keep the two in step. One addition, step 2b: debootstrap inside the rootfs, for images built with
# `Bootstrap: debootstrap` (prorl-server build-image without --base). Afterwards:
#   export PRORL_APPTAINER=$BASE/bin/apptainer     (or put `apptainer` on PATH)
# The tests' image is $BASE/images/py.sif; image builds use $BASE/imgroot as their local base.
BASE=${BASE:-/tmp/apptainer-test}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
ROOTFS=$BASE/rootfs          # Debian sid + apptainer        (the "runtime")
IMGROOT=$BASE/imgroot        # Debian bookworm + python3      (the test image, as a dir)
IMAGE=$BASE/images/py.sif    # ... and as a SIF
PKGS="apptainer squashfs-tools uidmap fuse2fs squashfuse fuse-overlayfs e2fsprogs gocryptfs"
# NB: do NOT add "fakeroot": apptainer would inject sid's faked (needs glibc 2.38) into
# images for --fakeroot in root-mapped mode -> breaks with older images (bookworm).

[ "$(id -u)" -eq 0 ] || { echo "setup.sh: run as root" >&2; exit 1; }
now() { date +%s.%N; }
took() { awk -v l="$1" -v a="$(now)" -v b="$2" 'BEGIN{printf "   %-28s %6.1f s\n", l, a-b}'; }
mkdir -p "$BASE/bin" "$BASE/images" "$BASE/work"
chmod 1777 "$BASE/work"                      # scratch dir for tests (under /tmp -> shared)

# --- 0. host tools (bookworm packages only) --------------------------------------
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v bwrap       >/dev/null || need+=(bubblewrap)
[ ${#need[@]} -eq 0 ] || apt-get install -y -q "${need[@]}"

# --- 1. sid rootfs ------------------------------------------------------------------
if [ ! -x "$ROOTFS/usr/bin/apt-get" ]; then
    t=$(now); rm -rf "$ROOTFS"
    debootstrap --variant=minbase sid "$ROOTFS" "$MIRROR" > "$BASE/debootstrap-sid.log" 2>&1 \
        || { tail -20 "$BASE/debootstrap-sid.log"; exit 1; }
    took "debootstrap sid" "$t"
fi
# run a command as root inside the rootfs (bwrap as root keeps all caps; no mounts leak)
in_rootfs() {
    bwrap --bind "$ROOTFS" / --proc /proc --dev-bind /dev /dev \
          --ro-bind /etc/resolv.conf /etc/resolv.conf \
          --setenv PATH /usr/sbin:/usr/bin:/sbin:/bin --setenv DEBIAN_FRONTEND noninteractive "$@"
}

# --- 2. apptainer inside it ------------------------------------------------------------
# the mirror's sid Release file may be "expired" relative to this VM's clock
echo 'Acquire::Check-Valid-Until "false";' > "$ROOTFS/etc/apt/apt.conf.d/99no-check-valid-until"
if [ ! -x "$ROOTFS/usr/bin/apptainer" ]; then
    t=$(now)
    in_rootfs /bin/sh -c "apt-get update -q && apt-get install -y -q --no-install-recommends $PKGS" \
        > "$BASE/apt-install.log" 2>&1 || { tail -20 "$BASE/apt-install.log"; exit 1; }
    in_rootfs /bin/sh -c 'apt-get clean && rm -rf /var/lib/apt/lists/*'   # -260 MB; apt-get update to add more
    took "apt-get install apptainer" "$t"
fi
# --- 2b. (prorl-server) debootstrap for "Bootstrap: debootstrap" builds; also on an existing install
if [ ! -x "$ROOTFS/usr/sbin/debootstrap" ]; then
    t=$(now)
    in_rootfs /bin/sh -c 'apt-get update -q && apt-get install -y -q --no-install-recommends debootstrap \
        && apt-get clean && rm -rf /var/lib/apt/lists/*' > "$BASE/apt-debootstrap.log" 2>&1 \
        || { tail -20 "$BASE/apt-debootstrap.log"; exit 1; }
    took "apt-get install debootstrap" "$t"
fi
mkdir -p "$ROOTFS/.oldroot" "$ROOTFS/run/apptainer-wrap"   # used by the wrapper
touch "$ROOTFS/etc/hosts"

# world-usable FUSE device node (host /dev/fuse is 0600 here; unprivileged apptainer
# mounts SIF images with squashfuse and fails with "failed to open /dev/fuse" without it)
if [ ! -c "$BASE/dev-fuse" ]; then
    read -r maj min < <(stat -c '%t %T' /dev/fuse)
    mknod -m 0666 "$BASE/dev-fuse" c $((16#$maj)) $((16#$min))
fi

# --- 3. the host-side wrapper ---------------------------------------------------------
cat > "$BASE/bin/apptainer" <<'WRAPPER'
#!/bin/bash
# Host-side wrapper: run the *real* apptainer (Debian sid package) that lives in
# a sid root filesystem, from a Debian bookworm host.
#
#  - called as root      : bwrap (as root: all capabilities kept, no user namespace,
#                          pivot_root into the rootfs, mounts die with the process).
#  - root + APPTAINER_WRAP_USER=<name|uid> (or APPTAINER_WRAP_NO_BWRAP=1):
#                          unshare -m + mounts + pivot_root, then (setpriv) drop to that
#                          host user *inside*: a faithful "unprivileged apptainer user";
#                          setuid newuidmap works, so --fakeroot gets /etc/subuid ranges.
#  - called as non-root  : bwrap with an unprivileged user namespace; apptainer runs
#                          nested in it (--fakeroot = root-mapped namespace only).
#
# Host paths that are visible at the same path inside (so image files, bind
# sources, sockets work): /tmp /var/tmp /home + APPTAINER_WRAP_BINDS (colon list).
# Host /etc/{passwd,group,subuid,subgid,hosts,resolv.conf} are bound read-only so
# users created on the host are known to apptainer.
set -euo pipefail

BASE=${APPTAINER_WRAP_BASE:-/tmp/apptainer-test}
ROOTFS=${APPTAINER_WRAP_ROOTFS:-$BASE/rootfs}
FUSEDEV=$BASE/dev-fuse            # world-usable copy of /dev/fuse (mknod c 10 229, 0666)
SHARED=(/tmp /var/tmp /home)
if [ -n "${APPTAINER_WRAP_BINDS:-}" ]; then
    IFS=: read -r -a _extra <<< "$APPTAINER_WRAP_BINDS"
    SHARED+=("${_extra[@]}")
fi
# cwd is kept only if it is under a shared path (else "/" - a same-named dir of the
# rootfs would silently be a *different* directory)
WD=/
for p in "${SHARED[@]}"; do case "$PWD/" in "${p%/}"/*) WD=$PWD;; esac; done
ETC_FILES=(/etc/passwd /etc/group /etc/subuid /etc/subgid /etc/hosts /etc/resolv.conf)
APPTAINER=/usr/bin/apptainer
[ "$(basename "$0")" = singularity ] && APPTAINER=/usr/bin/singularity

[ -x "$ROOTFS$APPTAINER" ] || { echo "apptainer wrapper: $ROOTFS$APPTAINER missing (run setup.sh)" >&2; exit 127; }

# /etc/subuid|subgid for root: host file + a root range (needed by "--fakeroot" as root)
subid_with_root() {
    cat "/etc/$1" 2>/dev/null || true
    grep -qs '^root:' "/etc/$1" || echo "root:1879048192:65536"
}

# ---- root caller, fast path: bwrap as root (keeps all caps; ~5 ms instead of ~75 ms
# for unshare+mount+pivot_root). Not for APPTAINER_WRAP_USER: bwrap sets no_new_privs,
# which would break the setuid newuidmap that unprivileged --fakeroot needs.
if [ "$(id -u)" -eq 0 ] && [ -z "${APPTAINER_WRAP_USER:-}" ] && [ -z "${APPTAINER_WRAP_NO_BWRAP:-}" ]; then
    # --bind /proc, not --proc: bwrap read-only-overmounts parts of a fresh /proc, and a
    # not "fully visible" /proc makes the kernel refuse proc mounts in nested userns (--fakeroot)
    args=(--bind "$ROOTFS" / --bind /proc /proc --bind /sys /sys --dev-bind /dev /dev)
    for p in "${SHARED[@]}"; do [ -e "$p" ] && args+=(--bind "$p" "$p"); done
    for f in "${ETC_FILES[@]}"; do
        case "$f" in /etc/subuid|/etc/subgid) continue;; esac
        [ -e "$f" ] && args+=(--ro-bind "$f" "$f")
    done
    exec bwrap "${args[@]}" --ro-bind-data 8 /etc/subuid --ro-bind-data 9 /etc/subgid \
        --chdir "$WD" -- "$APPTAINER" "$@" 8< <(subid_with_root subuid) 9< <(subid_with_root subgid)
fi

if [ "$(id -u)" -eq 0 ]; then
    if [ -z "${_APPTAINER_WRAP_INNER:-}" ]; then
        # re-exec ourselves inside a fresh, private mount namespace
        _APPTAINER_WRAP_INNER=1 exec unshare --mount --propagation private -- "$(readlink -f "$0")" "$@"
    fi
    unset _APPTAINER_WRAP_INNER
    R=$ROOTFS
    # the new "/" must be a mount point (pivot_root needs it; with a plain chroot the
    # starter fails: "Failed to set mount propagation: Invalid argument")
    mount --bind "$R" "$R"
    mount -t proc proc "$R/proc"
    mount --rbind /sys "$R/sys"
    mount --rbind /dev "$R/dev"
    [ -c "$FUSEDEV" ] && mount --bind "$FUSEDEV" "$R/dev/fuse"
    for p in "${SHARED[@]}"; do
        [ -e "$p" ] || continue
        mkdir -p "$R$p"
        mount --rbind "$p" "$R$p"
    done
    for f in "${ETC_FILES[@]}"; do
        [ -e "$f" ] || continue
        [ -e "$R$f" ] || [ -L "$R$f" ] || touch "$R$f"
        mount --bind "$f" "$R$f" && mount -o remount,bind,ro "$R$f"
    done
    # "apptainer --fakeroot" run by root needs a root entry in /etc/subuid+subgid:
    # overlay merged copies (host file + root range) from a namespace-private tmpfs
    mkdir -p "$R/run/apptainer-wrap" 2>/dev/null || true
    mount -t tmpfs -o size=1m,mode=0755 apptainer-wrap "$R/run/apptainer-wrap"
    for f in subuid subgid; do
        subid_with_root "$f" > "$R/run/apptainer-wrap/$f"
        mount --bind "$R/run/apptainer-wrap/$f" "$R/etc/$f"
    done
    # pivot_root (not chroot!): apptainer's starter aborts in a chroot with
    # "Running inside a weak chrooted environment, prefer pivot_root instead of chroot"
    mkdir -p "$R/.oldroot" 2>/dev/null || true
    cd "$R"
    pivot_root . .oldroot
    cd /
    /usr/bin/umount -l /.oldroot            # from here on only the sid rootfs is visible
    cd "$WD" 2>/dev/null || cd /
    if [ -n "${APPTAINER_WRAP_USER:-}" ]; then
        pw=$(getent passwd "$APPTAINER_WRAP_USER") || { echo "apptainer wrapper: unknown user $APPTAINER_WRAP_USER" >&2; exit 1; }
        IFS=: read -r u _ uid gid _ home _ <<< "$pw"
        unset APPTAINER_WRAP_USER
        export HOME=$home USER=$u LOGNAME=$u
        exec /usr/bin/setpriv --reuid="$uid" --regid="$gid" --init-groups "$APPTAINER" "$@"
    fi
    exec "$APPTAINER" "$@"
fi

# ---- unprivileged caller: bubblewrap ------------------------------------------
args=(--bind "$ROOTFS" / --bind /proc /proc --ro-bind /sys /sys --dev-bind /dev /dev)
[ -c "$FUSEDEV" ] && args+=(--dev-bind "$FUSEDEV" /dev/fuse)
for p in "${SHARED[@]}"; do
    [ -e "$p" ] || continue
    # bwrap cannot mkdir a missing mount point in the root-owned rootfs as non-root
    [ -e "$ROOTFS$p" ] || { echo "apptainer wrapper: missing mount point, run as root: mkdir -p $ROOTFS$p" >&2; exit 1; }
    args+=(--bind "$p" "$p")
done
# NOT /etc/subuid+subgid: newuidmap cannot work inside bwrap's user namespace (it is
# not root-owned there), so hide the user's subuid entry -> apptainer --fakeroot
# falls back to a "root-mapped namespace" (uid 0 inside == caller outside).
for f in "${ETC_FILES[@]}"; do
    case "$f" in /etc/subuid|/etc/subgid) continue;; esac
    [ -e "$f" ] && args+=(--ro-bind "$f" "$f")
done
args+=(--chdir "$WD")

# "exec|shell|run|... instance://NAME": the instance's user namespace is a child of
# the user namespace of the bwrap that *started* it; a fresh bwrap would be a sibling
# and apptainer fails with "Failed to enter in user namespace: Permission denied".
# So join that parent user namespace (bwrap --userns FD) instead of creating one.
inst=
for a in "$@"; do case "$a" in instance://*) inst=${a#instance://}; inst=${inst%%/*}; break;; esac; done
if [ -n "$inst" ]; then
    json="${HOME:-}/.apptainer/instances/app/$(hostname)/$(id -un)/$inst/$inst.json"
    if [ -r "$json" ]; then
        read -r -d '' pycode <<'PY' || true
import fcntl, json, os, sys
NS_GET_PARENT = 0xb702                      # _IO(0xb7, 0x2), linux/nsfs.h
meta, argv = sys.argv[1], sys.argv[2:]
try:
    pid = json.load(open(meta))["pid"]
    ns = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY)
    parent = fcntl.ioctl(ns, NS_GET_PARENT)
    os.set_inheritable(parent, True)
    argv = ["--userns", str(parent)] + argv
except Exception as e:                       # fall back to a new user namespace
    print(f"apptainer wrapper: cannot join instance user namespace: {e}", file=sys.stderr)
os.execvp("bwrap", ["bwrap"] + argv)
PY
        exec /usr/bin/python3 -c "$pycode" "$json" "${args[@]}" -- "$APPTAINER" "$@"
    fi
fi
exec bwrap "${args[@]}" -- "$APPTAINER" "$@"
WRAPPER
chmod 755 "$BASE/bin/apptainer"
ln -sfn apptainer "$BASE/bin/singularity"
APPTAINER="$BASE/bin/apptainer"
[ "$BASE" = /tmp/apptainer-test ] || sed -i "s|^BASE=\${APPTAINER_WRAP_BASE:-/tmp/apptainer-test}|BASE=\${APPTAINER_WRAP_BASE:-$BASE}|" "$APPTAINER"

# --- 4. capabilities: "root default capabilities = full" requests all 41 caps; if the
# host's bounding set lacks one (here CAP_SYS_RESOURCE) every root run fails with
# "Requesting capability set 0x1ffffffffff while permitted capability set is ...".
bnd=$(awk '/^CapBnd:/{print $2}' /proc/self/status)
if [ $((16#$bnd)) -ne $((16#1ffffffffff)) ]; then
    names=(CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP
           LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER
           SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE
           SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP
           MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF
           CHECKPOINT_RESTORE)
    caps=()
    for i in "${!names[@]}"; do (( (16#$bnd >> i) & 1 )) && caps+=("CAP_${names[$i]}"); done
    sed -i 's/^root default capabilities = .*/root default capabilities = file/' \
        "$ROOTFS/etc/apptainer/apptainer.conf"
    "$APPTAINER" capability add --user root "$(IFS=,; echo "${caps[*]}")" >/dev/null 2>&1
    echo "   root capabilities limited to host bounding set ($bnd)"
fi

# --- 5. a python3 test image: bookworm minbase (same python 3.11 as the host) ------------
if [ ! -x "$IMGROOT/usr/bin/python3" ]; then
    t=$(now); rm -rf "$IMGROOT"
    debootstrap --variant=minbase --include=python3 bookworm "$IMGROOT" "$MIRROR" \
        > "$BASE/debootstrap-img.log" 2>&1 || { tail -20 "$BASE/debootstrap-img.log"; exit 1; }
    rm -rf "$IMGROOT"/var/cache/apt/*.bin "$IMGROOT"/var/cache/apt/archives/*.deb \
           "$IMGROOT"/var/lib/apt/lists/* "$IMGROOT"/usr/share/{doc,man,locale}/*
    took "debootstrap bookworm image" "$t"
fi
if [ ! -s "$IMAGE" ]; then
    t=$(now)
    "$APPTAINER" build -F "$IMAGE" "$IMGROOT/" > "$BASE/build-image.log" 2>&1 \
        || { tail -20 "$BASE/build-image.log"; exit 1; }
    took "apptainer build py.sif" "$t"
fi

# --- 6. self-test ---------------------------------------------------------------------------
"$APPTAINER" --version
"$APPTAINER" exec "$IMAGE" python3 -c 'import sys; print("container python", sys.version.split()[0])'
du -sh "$ROOTFS" "$IMGROOT" "$IMAGE" 2>/dev/null | sed 's/^/   /'
echo "OK. Use $APPTAINER"
