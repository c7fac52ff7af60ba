"""Escape attempts from inside a sandbox, as a list of cases run against every isolating runtime we ship.

Each case is what hostile task code would try; it runs in a real sandbox (bubblewrap, Apptainer) started
the way the server starts them (as root here, as in the quickstart and CI), and passes when the attempt is
contained. The local runtime is no sandbox (docs/security.md) and is not tried. Probes that would change
the host if they got through write back the value they read (a sysctl) or stay within the test's own files.
"""

from __future__ import annotations

import os
import socket
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from prorl_server import AgentHandler, JobContext
from prorl_server.api import ServerState, create_app
from prorl_server.config import ServerSettings
from prorl_server.handlers import HandlerRegistry
from prorl_server.sandbox import SandboxSpec
from prorl_server.sandbox.landlock import unavailable_reason as landlock_unavailable
from prorl_server.sandbox.network_guard import NetworkGuard
from prorl_server.sandbox.reaper import tagged_processes
from prorl_server.sandbox.registry import unavailable_reason
from prorl_server.sandbox.seccomp import unavailable_reason as seccomp_unavailable
from prorl_server.testing import UvicornThread
from prorl_server.testing.uvicorn_thread import free_port

pytest_plugins = ("sandbox_fixtures",)


@dataclass(frozen=True)
class Attempt:
    """Python run inside the sandbox; it prints CONTAINED, or ESCAPED and what got through."""

    name: str
    code: str
    spec: tuple[tuple[str, object], ...] = ()


def attempt(name: str, code: str, **spec: object) -> Attempt:
    return Attempt(name, textwrap.dedent(code), tuple(spec.items()))


ATTEMPTS = [
    attempt(
        "write kernel.core_pattern (a route to running code as host root)",
        """
        try:
            value = open("/proc/sys/kernel/core_pattern").read()
            with open("/proc/sys/kernel/core_pattern", "w") as f:
                f.write(value)  # the same value: harmless if it gets through
            print("ESCAPED: wrote /proc/sys/kernel/core_pattern")
        except OSError as e:
            print("CONTAINED", e)
        """,
    ),
    attempt(
        "find any writable file under /proc/sys, /proc/sysrq-trigger, /sys",
        """
        import os
        writable = []
        for top in ("/proc/sys", "/sys"):
            for root, dirs, files in os.walk(top):
                if root.count("/") > 6:
                    dirs[:] = []
                writable += [os.path.join(root, f) for f in files if os.access(os.path.join(root, f), os.W_OK)]
        if os.path.exists("/proc/sysrq-trigger") and os.access("/proc/sysrq-trigger", os.W_OK):
            writable.append("/proc/sysrq-trigger")
        print("ESCAPED:", writable[:5]) if writable else print("CONTAINED")
        """,
    ),
    attempt(
        "write past disk_mb through any writable mount (the old socket directory was one)",
        """
        import os
        chunk, limit, taken = b"x" * (1 << 20), 40, {}
        skip = ("proc", "sysfs", "devpts", "mqueue", "cgroup", "cgroup2")
        for line in open("/proc/self/mountinfo"):
            fields = line.split()
            point, options, fstype = fields[4], fields[5], fields[fields.index("-") + 1]
            if "rw" not in options.split(",") or fstype in skip or not os.access(point, os.W_OK):
                continue
            path, written = os.path.join(point, ".escape-probe"), 0
            try:
                with open(path, "wb") as f:
                    for _ in range(limit):
                        f.write(chunk)
                        f.flush()
                        written += len(chunk)
            except OSError:
                pass
            finally:
                if os.path.exists(path):
                    written = max(written, os.path.getsize(path))
                    os.unlink(path)
            taken[point] = (written >> 20, fstype)
        # Apptainer's /dev/shm is an unsized tmpfs: memory charged to the sandbox's memory cgroup, not disk
        memory = {"/dev/shm"} if os.environ.get("PROBE_RUNTIME") == "apptainer" else set()
        over = {p: mb for p, (mb, fstype) in taken.items() if mb > 17 and not (p in memory and fstype == "tmpfs")}
        print("ESCAPED:", over) if over else print("CONTAINED", taken)
        """,
        limits={"disk_mb": 16},
    ),
    attempt(
        "write to the host through inherited output descriptors (/proc/<pid>/fd/1, 2)",
        """
        import os
        written = {}
        for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
            for fd in (1, 2):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith(("/dev/pts/", "/dev/null")):  # the sandbox's own terminal
                        continue
                    out = os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
                except OSError:
                    continue
                total = 0
                try:
                    for _ in range(40):
                        total += os.write(out, b"y" * (1 << 20))
                except OSError:
                    pass
                finally:
                    os.close(out)
                written[f"{pid}/{fd} {target}"] = total
        big = {k: v for k, v in written.items() if v > (2 << 20)}
        print("ESCAPED:", big) if big else print("CONTAINED", written)
        """,
    ),
    attempt(
        "find the tool socket to replace it with a server of one's own",
        """
        import os, stat
        found = [p for p in ("/run/prorl/tools.sock", "/run/prorl") if os.path.exists(p)]
        for root, dirs, files in os.walk("/"):
            dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/dev", "/usr")]
            for name in files:
                try:
                    if stat.S_ISSOCK(os.lstat(os.path.join(root, name)).st_mode):
                        found.append(os.path.join(root, name))
                except OSError:
                    pass
        print("ESCAPED:", found) if found else print("CONTAINED")
        """,
    ),
    attempt(
        "inherit a host descriptor (listening socket, Landlock ruleset, seccomp program)",
        """
        import os
        leaked = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if int(fd) > 2 and not target.startswith("/proc/"):
                leaked.append((fd, target))
        print("ESCAPED:", leaked) if leaked else print("CONTAINED")
        """,
    ),
    attempt(
        "create a user namespace, mount, use the keyring, BPF, perf, io_uring",
        """
        import ctypes, platform
        libc = ctypes.CDLL(None, use_errno=True)
        done = {}
        done["unshare(CLONE_NEWUSER)"] = libc.unshare(0x10000000)
        done["mount tmpfs"] = libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)
        if platform.machine() == "x86_64":
            done["keyctl"] = libc.syscall(250, 0, -1, 0)  # KEYCTL_GET_KEYRING_ID of the thread keyring
            done["bpf"] = libc.syscall(321, 0, None, 0)
            done["perf_event_open"] = libc.syscall(298, None, 0, -1, -1, 0)
            done["io_uring_setup"] = libc.syscall(425, 1, None)
        ok = [k for k, v in done.items() if v >= 0]
        print("ESCAPED:", ok) if ok else print("CONTAINED", done)
        """,
    ),
]


@pytest.mark.parametrize("case", ATTEMPTS, ids=[a.name for a in ATTEMPTS])
async def test_escape_attempt_is_contained(isolated, case: Attempt):
    sandbox = await isolated.start(**dict(case.spec))
    out = await sandbox.bash(f"PROBE_RUNTIME={isolated.name} python3 - <<'PROBE'\n{case.code}\nPROBE", timeout=120)
    assert "CONTAINED" in out.output and "ESCAPED" not in out.output, out.output


async def test_sandbox_processes_never_run_as_host_root(isolated):
    sandbox = await isolated.start(fakeroot=os.geteuid() != 0)
    await sandbox.bash("sleep 1234 & sleep 0.2")
    pids = [p.pid for p in tagged_processes() if p.sandbox_id == sandbox.id]
    sleepers = [
        pid for pid in pids if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"1234"]
    ]
    assert sleepers
    for pid in sleepers:
        uids = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:"))
        assert set(uids.split()[1:]) != {"0"}, f"sandbox process {pid} runs as host root: {uids}"


@pytest.fixture
def listeners() -> Iterator[list[int]]:
    """Four TCP listeners on the host's 127.0.0.1 (an API, a backend, anything else, an LLM judge); yields
    their ports."""
    servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(4)]
    stop = threading.Event()

    def accept(server: socket.socket) -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                server.accept()[0].close()
            except TimeoutError:
                continue

    threads = [threading.Thread(target=accept, args=(s,), daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    yield [s.getsockname()[1] for s in servers]
    stop.set()
    for thread in threads:
        thread.join()
    for server in servers:
        server.close()


CONNECT = """
import socket
for port in {ports}:
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", port))
        print(port, "CONNECTED")
    except OSError as e:
        print(port, "REFUSED", e.errno)
    s.close()
"""

needs_landlock = pytest.mark.skipif(
    landlock_unavailable() is not None, reason=f"Landlock network rules: {landlock_unavailable()}"
)


@needs_landlock
@pytest.mark.parametrize("network", ["host", "loopback"])
async def test_host_network_sandbox_cannot_reach_the_api_or_the_backends(isolated, listeners, network):
    api, backend, other, judge = listeners
    guard = NetworkGuard(api_ports=[api], backend_ports=lambda: [backend], judge_ports=[judge, 443])
    isolated.runtime.network_guard = guard
    assert 443 not in guard.judge_ports  # a hosted judge on the web's port: denying it would deny the web
    guarded = await isolated.start(network=network)
    out = await guarded.bash(f"python3 - <<'PROBE'\n{CONNECT.format(ports=[api, backend, other, judge])}\nPROBE")
    lines = dict(line.split(" ", 1) for line in out.output.splitlines() if line[:1].isdigit())
    assert lines[str(api)].startswith("REFUSED 13") and lines[str(backend)].startswith("REFUSED 13"), out.output
    assert lines[str(judge)].startswith("REFUSED 13"), out.output
    assert lines[str(other)] == "CONNECTED", out.output
    allowed = await isolated.start(network=network, allow_api=True, allow_llm_backends=True)
    out = await allowed.bash(f"python3 - <<'PROBE'\n{CONNECT.format(ports=[api, backend, judge])}\nPROBE")
    lines = dict(line.split(" ", 1) for line in out.output.splitlines() if line[:1].isdigit())
    assert lines[str(api)] == "CONNECTED" and lines[str(backend)] == "CONNECTED", out.output
    assert lines[str(judge)].startswith("REFUSED 13"), out.output  # the judge stays out of the policy's reach


@needs_landlock
async def test_host_network_sandbox_cannot_reach_host_abstract_sockets_or_get_around_landlock(isolated, listeners):
    api = listeners[0]
    isolated.runtime.network_guard = NetworkGuard(api_ports=[api])
    name = f"prorl-escape-{os.getpid()}"
    host = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    host.bind("\0" + name)
    host.listen(1)
    try:
        sandbox = await isolated.start(network="host")
        probe = f"""
        import socket
        tried = {{}}
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect("\\0{name}"); tried["abstract"] = "CONNECTED"
        except OSError as e:
            tried["abstract"] = e.errno
        for label, make in (("mptcp", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)),):
            try:
                m = make(); m.settimeout(5); m.connect(("127.0.0.1", {api})); tried[label] = "CONNECTED"
            except OSError as e:
                tried[label] = e.errno
        f = socket.socket()
        try:
            f.sendto(b"x", 0x20000000, ("127.0.0.1", {api})); tried["fastopen"] = "CONNECTED"
        except OSError as e:
            tried["fastopen"] = e.errno
        print(tried)
        print("ESCAPED") if "CONNECTED" in tried.values() else print("CONTAINED")
        """
        out = await sandbox.bash(f"python3 - <<'PROBE'\n{textwrap.dedent(probe)}\nPROBE")
        assert "CONTAINED" in out.output and "ESCAPED" not in out.output, out.output
    finally:
        host.close()


@pytest.mark.skipif(seccomp_unavailable() is not None, reason=f"seccomp: {seccomp_unavailable()}")
async def test_seccomp_is_on_in_the_sandbox(isolated):
    sandbox = await isolated.start()
    out = await sandbox.bash("grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status")
    assert "Seccomp:\t2" in out.output and "NoNewPrivs:\t1" in out.output, out.output


class NetworkProbe(AgentHandler):
    """RUN starts a sandbox on the host network and tries the ports the instance names."""

    name = "network_probe"

    async def run(self, ctx: JobContext) -> None:
        sandbox = await ctx.start_sandbox(SandboxSpec(network="host"))
        out = await sandbox.bash(f"python3 - <<'PROBE'\n{CONNECT.format(ports=ctx.instance['ports'])}\nPROBE")
        ctx.artifacts["probe"] = out.output

    async def eval(self, ctx: JobContext) -> float:
        return 0.0


@needs_landlock
@pytest.mark.skipif(unavailable_reason("bwrap") is not None, reason=f"bwrap: {unavailable_reason('bwrap')}")
def test_a_jobs_host_network_sandbox_cannot_reach_its_server_or_the_backends(backend):
    """The server wires the guard itself: its own port and every registered backend's port are denied."""
    port = free_port()
    registry = HandlerRegistry()
    registry.register("network_probe", NetworkProbe())
    settings = ServerSettings(port=port, runtime="bwrap", llm_servers=[backend.address], autostart=True)
    state = ServerState.build(settings, registry=registry)
    server = UvicornThread(create_app(state=state), port=port).start()
    try:
        backend_port = backend.server.port
        body = {"instance": {"data_source": "network_probe", "ports": [port, backend_port]}}
        result = httpx.post(f"{server.url}/process", json=body, timeout=120, trust_env=False).json()
    finally:
        server.stop()
    assert result["status"] == "completed", result
    probe = result["artifacts"]["probe"]
    assert f"{port} REFUSED 13" in probe and f"{backend_port} REFUSED 13" in probe, probe
