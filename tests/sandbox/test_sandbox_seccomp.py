"""The seccomp deny-list: the kernel accepts it; in a filtered child the denied system calls fail with EPERM
(and the ways around Landlock with their "not supported" errnos) while ordinary work goes on; the same through
bubblewrap's `--seccomp FD` and through `INSTALL_SOURCE` under `python -I -S` (how a sandbox bootstrap runs)."""

from __future__ import annotations

import errno
import json
import os
import platform
import struct
import subprocess
import sys

import pytest
from bwrap_probe import bwrap_reason

from prorl_server.sandbox import seccomp

pytestmark = pytest.mark.skipif(seccomp.unavailable_reason() is not None, reason=str(seccomp.unavailable_reason()))

ARCH = platform.machine()
BWRAP = ["--unshare-user", "--unshare-pid", "--cap-drop", "ALL", "--die-with-parent"]
BWRAP += [
    "--ro-bind",
    "/",
    "/",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--tmpfs",
    "/dev/shm",
    "--setenv",
    "TMPDIR",
    "/dev/shm",
]
# (not a tmpfs over /tmp: the Python running the tests may live there)

# Runs in the child with the syscall table as argv[1]; prints {probe: errno or 0} as JSON. Each denied call
# has arguments that make it fail harmlessly (or act on the child alone) should the filter be missing, even
# for root: kexec_load with an unknown flag, mount of NULL, unshare of the child's own mount namespace.
PROBE = r"""
import ctypes, json, mmap, os, socket, subprocess, sys, tempfile, threading
NR = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
out = {}
def sys_(name, nr, *args):
    r = libc.syscall(nr, *args)
    out[name] = ctypes.get_errno() if r < 0 else 0
    if r > 2 and name in ("userfaultfd", "io_uring_setup"):
        os.close(r)
def err(name, fn):
    try:
        fn()
        out[name] = 0
    except OSError as e:
        out[name] = e.errno
    except Exception as e:
        out[name] = repr(e)
sys_("unshare", NR["unshare"], 0x20000)
sys_("mount", NR["mount"], None, None, None, 0, None)
sys_("keyctl", NR["keyctl"], 0, -1, 0)
sys_("bpf", NR["bpf"], 0, None, 0)
sys_("io_uring_setup", NR["io_uring_setup"], 0, None)
sys_("perf_event_open", NR["perf_event_open"], None, 0, -1, -1, 0)
sys_("userfaultfd", NR["userfaultfd"], os.O_CLOEXEC | 1)
sys_("kexec_load", NR["kexec_load"], 0, 0x7FFFFFFF, None, 0x8000)
if "iopl" in NR:
    sys_("x32_getpid", 0x40000000 | 39)
err("mptcp", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262).close())
err("smc", lambda: socket.socket(43, socket.SOCK_STREAM, 0).close())
fastopen_server = socket.create_server(("127.0.0.1", 0))
fastopen = fastopen_server.getsockname()
err("fastopen_sendto", lambda: socket.socket().sendto(b"x", 0x20000000, fastopen))
err("fastopen_sendmsg", lambda: socket.socket().sendmsg([b"x"], [], 0x20000000, fastopen))
server = socket.create_server(("127.0.0.1", 0))
port = server.getsockname()[1]
# ordinary work
def tcp():
    c = socket.create_connection(("127.0.0.1", port))
    a = server.accept()[0]
    c.sendall(b"hi")
    assert a.recv(2) == b"hi"
err("tcp", tcp)
def udp():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("127.0.0.1", 0))
    u.sendto(b"a", u.getsockname())
    u.sendmsg([b"b"], [], 0, u.getsockname())
    assert u.recv(1) + u.recv(1) == b"ab"
err("udp", udp)
def files():
    with tempfile.TemporaryDirectory() as d:
        with open(d + "/f", "w") as f:
            f.write("data")
        with open(d + "/f") as f:
            assert f.read() == "data"
err("files", files)
err("fork_exec", lambda: subprocess.run(["true"], check=True))
def pair():
    a, b = socket.socketpair()
    a.sendall(b"x")
    assert b.recv(1) == b"x"
err("socketpair", pair)
def thread():
    box = []
    t = threading.Thread(target=box.append, args=(1,))
    t.start()
    t.join()
    assert box == [1]
err("thread", thread)
def mapped():
    m = mmap.mmap(-1, 1 << 20)
    m[:3] = b"abc"
    assert m[:3] == b"abc"
err("mmap", mapped)
with open("/proc/self/status") as f:
    out["status"] = [line.split()[1] for line in f if line.startswith("Seccomp:")][0]
print(json.dumps(out))
"""

DENIED_SAMPLE = ["unshare", "mount", "keyctl", "bpf", "io_uring_setup", "perf_event_open", "userfaultfd"]
DENIED_SAMPLE += ["kexec_load"] + (["x32_getpid"] if ARCH == "x86_64" else [])
ORDINARY = ["tcp", "udp", "files", "fork_exec", "socketpair", "thread", "mmap"]
AROUND_LANDLOCK = {
    "mptcp": errno.EPROTONOSUPPORT,
    "smc": errno.EAFNOSUPPORT,
    "fastopen_sendto": errno.EOPNOTSUPP,
    "fastopen_sendmsg": errno.EOPNOTSUPP,
}
INSTALL = "from prorl_server.sandbox import seccomp\nseccomp.install(seccomp.deny_program())\n"


def probe(argv: list[str], code: str, **kwargs) -> dict[str, object]:
    numbers = json.dumps(seccomp._NUMBERS[ARCH])
    done = subprocess.run([*argv, "-c", code + PROBE, numbers], capture_output=True, text=True, timeout=60, **kwargs)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def assert_filtered(result: dict[str, object]) -> None:
    assert result["status"] == "2"
    assert {name: result[name] for name in DENIED_SAMPLE} == dict.fromkeys(DENIED_SAMPLE, errno.EPERM)
    assert {name: result[name] for name in AROUND_LANDLOCK} == AROUND_LANDLOCK
    assert {name: result[name] for name in ORDINARY} == dict.fromkeys(ORDINARY, 0)


def run_bpf(program: bytes, arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    """The return value of a classic BPF program of the four kinds of instruction the assembler emits."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *args, *[0] * (6 - len(args)))
    insns = list(struct.iter_unpack("<HBBI", program))
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x06:
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf


ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS


@pytest.mark.parametrize(("arch", "audit_arch"), [("x86_64", 0xC000003E), ("aarch64", 0xC00000B7)])
def test_program_semantics(arch: str, audit_arch: int):
    """Every denied number returns EPERM, every other number is allowed; foreign arch and x32 denied."""
    program = seccomp.deny_program(arch)
    assert program is not None and len(program) % 8 == 0 and len(program) // 8 < 100
    numbers = seccomp._NUMBERS[arch]
    used = set(seccomp.DENIED) | set(seccomp.ARG_CHECKED) | set(seccomp.NOT_IMPLEMENTED)
    assert set(numbers) <= used, "a table entry nobody uses"
    denied = {numbers[name] for name in seccomp.DENIED if name in numbers}
    assert len(denied) == len([name for name in seccomp.DENIED if name in numbers]), "two names, one number"
    for nr in range(600):
        expected = EPERM if nr in denied else ENOSYS if nr == numbers["clone3"] else ALLOW
        assert run_bpf(program, audit_arch, nr) == expected, (arch, nr)
    assert run_bpf(program, 0x40000003, 39) == EPERM  # i386
    assert run_bpf(program, audit_arch, 0x40000000 | 39) == (EPERM if arch == "x86_64" else ALLOW)
    socket_nr, sendto, sendmsg, sendmmsg = (numbers[n] for n in ("socket", "sendto", "sendmsg", "sendmmsg"))
    assert run_bpf(program, audit_arch, socket_nr, (2, 1, 0)) == ALLOW
    assert run_bpf(program, audit_arch, socket_nr, (2, 1, 262)) == 0x00050000 | errno.EPROTONOSUPPORT
    assert run_bpf(program, audit_arch, socket_nr, (10, 1, 262 | 1 << 32)) == 0x00050000 | errno.EPROTONOSUPPORT
    assert run_bpf(program, audit_arch, socket_nr, (43, 1, 0)) == 0x00050000 | errno.EAFNOSUPPORT
    assert run_bpf(program, audit_arch, sendto, (3, 0, 1, 0x20000040)) == 0x00050000 | errno.EOPNOTSUPP
    assert run_bpf(program, audit_arch, sendmmsg, (3, 0, 1, 0x20000000)) == 0x00050000 | errno.EOPNOTSUPP
    assert run_bpf(program, audit_arch, sendmsg, (3, 0, 0x20000000)) == 0x00050000 | errno.EOPNOTSUPP
    assert run_bpf(program, audit_arch, sendto, (3, 0, 1, 0x40)) == ALLOW
    assert run_bpf(program, audit_arch, sendmsg, (3, 0, 0x40)) == ALLOW
    clone = numbers["clone"]
    assert run_bpf(program, audit_arch, clone, (0x01200011,)) == ALLOW  # fork: SIGCHLD | CLONE_CHILD_*TID
    assert run_bpf(program, audit_arch, clone, (0x003D0F00,)) == ALLOW  # a thread
    for flag in (0x10000000, 0x00020000, 0x20000000, 0x40000000):  # NEWUSER, NEWNS, NEWPID, NEWNET
        assert run_bpf(program, audit_arch, clone, (0x11 | flag,)) == EPERM


def test_tables():
    assert seccomp.deny_program("riscv64") is None
    assert seccomp.deny_program() == seccomp.deny_program(ARCH)
    assert "ptrace" not in seccomp.DENIED and "personality" not in seccomp.DENIED
    assert len(seccomp.DENIED) == len(set(seccomp.DENIED))
    # the numbers where the two tables agree are the ones every architecture shares (424 and later)
    x86, arm = seccomp._NUMBERS["x86_64"], seccomp._NUMBERS["aarch64"]
    assert {n for n in x86 if x86[n] >= 424} == {n for n in arm if arm[n] >= 424}
    assert all(x86[n] == arm[n] for n in x86 if x86[n] >= 424)


def test_filtered_child_denies_and_allows():
    unfiltered = probe([sys.executable], "")
    assert unfiltered["status"] == "0"
    assert {name: unfiltered[name] for name in ORDINARY} == dict.fromkeys(ORDINARY, 0)
    # without the filter these reach the kernel: keyctl and userfaultfd (user mode only) need no privilege
    assert unfiltered["keyctl"] != errno.EPERM and unfiltered["userfaultfd"] != errno.EPERM
    assert_filtered(probe([sys.executable], INSTALL))


def test_install_source_runs_in_a_bare_bootstrap():
    """INSTALL_SOURCE under `python -I -S` (no site, no prorl_server), as a sandbox's first process runs it."""
    code = seccomp.INSTALL_SOURCE + f"_seccomp(bytes.fromhex({seccomp.deny_program().hex()!r}))\n"
    assert_filtered(probe([sys.executable, "-I", "-S"], code))


def test_install_failure_raises_oserror():
    code = "from prorl_server.sandbox import seccomp\ntry:\n    seccomp.install(b'\\xff' * 8)\n"
    code += "except OSError as e:\n    print(e.errno)\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == str(errno.EINVAL), done.stderr


# i386 getpid through `int 0x80` from 64-bit code: mov eax, 20; int 0x80; ret
I386_GETPID = r"""
import ctypes, mmap, os
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))
print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))() == os.getpid())
print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))())
"""


@pytest.mark.skipif(ARCH != "x86_64", reason="i386 system calls exist only on x86_64")
def test_i386_int80_is_denied():
    control = subprocess.run([sys.executable, "-c", I386_GETPID], capture_output=True, text=True, timeout=60)
    if control.stdout.split()[:1] != ["True"]:
        pytest.skip(f"no i386 emulation in this kernel ({control.stdout.strip()} {control.stderr.strip()})")
    done = subprocess.run([sys.executable, "-c", INSTALL + I386_GETPID], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", str(-errno.EPERM)], done.stderr


def test_program_fd_holds_the_program():
    program = seccomp.deny_program()
    fd = seccomp.program_fd(program)
    try:
        assert not os.get_inheritable(fd)
        assert os.read(fd, 1 << 16) == program
    finally:
        os.close(fd)


def test_through_bwrap_seccomp_fd():
    if (reason := bwrap_reason(*BWRAP)) is not None:
        pytest.skip(reason)
    fd = seccomp.program_fd(seccomp.deny_program())
    try:
        argv = ["bwrap", *BWRAP, "--seccomp", str(fd), "--", sys.executable]
        assert_filtered(probe(argv, "", pass_fds=(fd,)))
    finally:
        os.close(fd)
