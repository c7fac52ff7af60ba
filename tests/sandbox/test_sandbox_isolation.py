"""Isolation of real sandboxes, for every isolating runtime: network, files, processes, each other.

No test sends traffic to a non-loopback address: inside a network namespace without routes, a connect to
an unroutable address fails at once with ENETUNREACH and nothing leaves the machine.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator

import pytest

from prorl_server.sandbox import Bind

CONNECT = (
    'python3 -c "import socket, sys; s = socket.socket(); s.settimeout(2)\n'
    "try:\n    s.connect(('{host}', {port})); print('CONNECTED')\n"
    "except OSError as e:\n    print('FAILED', e.errno, e)\""
)

pytest_plugins = ("sandbox_fixtures",)


@pytest.fixture
def host_listener() -> Iterator[int]:
    """A TCP listener on the host's 127.0.0.1 that accepts and closes; yields its port."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                server.accept()[0].close()
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


async def test_no_network_by_default_only_loopback_and_no_route_out(isolated, host_listener):
    sandbox = await isolated.start()
    interfaces = await sandbox.bash("python3 -c 'import socket; print(socket.if_nameindex())'")
    assert interfaces.output.strip() == "[(1, 'lo')]"
    egress = await sandbox.bash(CONNECT.format(host="10.255.255.1", port=80))
    assert "FAILED 101" in egress.output  # ENETUNREACH: no route, nothing sent
    host = await sandbox.bash(CONNECT.format(host="127.0.0.1", port=host_listener))
    assert "FAILED 111" in host.output  # ECONNREFUSED: its own loopback, not the host's


async def test_host_and_loopback_networks_reach_the_host_and_loopback_gets_its_own_address(isolated, host_listener):
    shared = await isolated.start(network="host")
    assert "CONNECTED" in (await shared.bash(CONNECT.format(host="127.0.0.1", port=host_listener))).output
    assert shared.address is None

    first, second = await isolated.start(network="loopback"), await isolated.start(network="loopback")
    assert first.address != second.address and first.address.startswith("127.")
    env = await first.bash("echo $PRORL_SANDBOX_ADDRESS")
    assert env.output.strip() == first.address
    serve = "python3 -c \"import os, socket; s = socket.create_server((os.environ['PRORL_SANDBOX_ADDRESS'], 8765)); s.accept()\" &"
    await first.bash(serve + " sleep 0.5")
    with socket.create_connection((first.address, 8765), timeout=5):
        pass  # the host reaches the service on the sandbox's own address


async def test_cannot_read_host_files_outside_its_binds(isolated, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "visible.txt").write_text("shared on purpose")
    sandbox = await isolated.start(binds=[Bind(source=str(shared), target="/data")])
    out = await sandbox.bash(f"cat {secret}; ls {tmp_path}; cat {__file__} | head -1; cat /data/visible.txt")
    assert "host secret" not in out.output and "No such file" in out.output
    assert "Isolation of real sandboxes" not in out.output  # this test file is not in the sandbox
    assert "shared on purpose" in out.output
    assert "Permission denied" in (await sandbox.bash("cat /etc/shadow")).output or os.geteuid() != 0


async def test_cannot_see_or_signal_host_processes(isolated):
    victim = subprocess.Popen(["sleep", "300"])
    try:
        sandbox = await isolated.start()
        out = await sandbox.bash(
            f"ls /proc | grep -c '^[0-9]'; ls -d /proc/{victim.pid}; kill -9 {victim.pid}; echo rc=$?"
        )
        visible = int(out.output.splitlines()[0])
        assert visible < 20, out.output  # only the sandbox's own few processes
        assert "No such file" in out.output and "rc=1" in out.output
        assert victim.poll() is None  # still alive
        parent = await sandbox.bash(f"kill -0 {os.getpid()} && echo SIGNALLED || echo REFUSED")
        assert "REFUSED" in parent.output
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()


async def test_writes_go_only_to_workspace_tmp_and_rw_binds(isolated, tmp_path):
    ro, rw = tmp_path / "ro", tmp_path / "rw"
    ro.mkdir()
    rw.mkdir()
    rw.chmod(0o777)  # a root server runs Apptainer sandboxes as uid 65534 (docs/sandboxes.md)
    sandbox = await isolated.start(
        binds=[Bind(source=str(ro), target="/ro"), Bind(source=str(rw), target="/rw", read_only=False)]
    )
    for path in ("/usr/x", "/etc/x", "/x", "/ro/x"):
        out = await sandbox.bash(f"touch {path}; echo rc=$?")
        assert "rc=1" in out.output and ("Read-only" in out.output or "Permission denied" in out.output), path
    ok = await sandbox.bash("touch /workspace/a /tmp/b /rw/c && pwd && echo OK")
    assert ok.output.split() == ["/workspace", "OK"]
    assert (rw / "c").exists() and not list(ro.iterdir())


async def test_binds_deep_inside_the_sandboxes_own_mounts_are_reachable(isolated, tmp_path):
    """The directories on the way to a bind are passable by the sandbox's user (a root server's bwrap would
    make them 0700 for root: a Python or a repository under /tmp would be out of reach)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "hello.txt").write_text("hello")
    data.chmod(0o755)
    sandbox = await isolated.start(binds=[Bind(source=str(data), target="/tmp/deep/er/data")])
    out = await sandbox.bash("cat /tmp/deep/er/data/hello.txt; echo; ls /tmp/deep/er")
    assert out.output.split() == ["hello", "data"], out.output


async def test_sandboxes_do_not_share_workspace_tmp_or_processes(isolated):
    one, two = await isolated.start(), await isolated.start()
    await one.bash("echo mine > /workspace/f; echo mine > /tmp/g; echo mine > /dev/shm/h; sleep 300 &")
    out = await two.bash(
        "cat /workspace/f /tmp/g /dev/shm/h 2>&1; grep -lx sleep /proc/[0-9]*/comm 2>/dev/null | wc -l"
    )
    assert "mine" not in out.output
    assert out.output.strip().splitlines()[-1] == "0"
