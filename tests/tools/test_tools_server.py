"""The execution server as a real subprocess on a Unix socket, driven through ToolClient."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import prorl_server
from prorl_server.tool_server.client import ToolClient, ToolError
from prorl_server.tool_server.protocol import SOCKET_NAME

needs_ipython = pytest.mark.skipif(
    not (importlib.util.find_spec("jupyter_client") and importlib.util.find_spec("ipykernel")),
    reason="IPython tests need jupyter_client and ipykernel (pip install jupyter_client ipykernel)",
)


@dataclass
class RunningServer:
    """A server process, its socket and its working directory."""

    process: subprocess.Popen[bytes]
    socket_path: str
    workdir: Path


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def wait_gone(pids: list[int], timeout: float = 5.0) -> list[int]:
    """The PIDs still alive after `timeout`."""
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [p for p in pids if alive(p)]


def start_server() -> RunningServer:
    """Start `python -m prorl_server.tool_server` and wait for its socket (short path: AF_UNIX allows 107 bytes)."""
    base = Path(tempfile.mkdtemp(prefix="pt-tools-"))
    workdir = base / "work"
    workdir.mkdir()
    socket_path = str(base / SOCKET_NAME)
    process = subprocess.Popen(
        [sys.executable, "-m", "prorl_server.tool_server", "--socket", socket_path, "--workdir", str(workdir)],
        stdout=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(base)},  # the server's private files go away with `base`
    )
    ready = process.stdout.readline()
    try:
        assert json.loads(ready)["ready"] is True, ready
    except BaseException:  # no server left behind by a failed start
        process.kill()
        process.wait()
        raise
    return RunningServer(process, socket_path, workdir)


def stop_server(server: RunningServer) -> None:
    """Stop the server if it still runs and remove its files."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGCONT)
        server.process.terminate()
        try:
            server.process.wait(10)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
    server.process.stdout.close()
    shutil.rmtree(server.workdir.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def shared_server() -> Iterator[RunningServer]:
    """One server for the tests that do not stop it (each test gets a fresh client)."""
    server = start_server()
    yield server
    stop_server(server)


@pytest.fixture
def own_server() -> Iterator[RunningServer]:
    """A server of this test alone (for tests that stop or break it)."""
    server = start_server()
    yield server
    stop_server(server)


@pytest.fixture
async def tools(shared_server: RunningServer) -> ToolClient:
    """A client of the shared server."""
    client = ToolClient(shared_server.socket_path)
    yield client
    await client.aclose()


# --- start-up -------------------------------------------------------------------------------------


def test_server_imports_only_the_standard_library_at_startup() -> None:
    code = (
        "import sys; import prorl_server.tool_server.__main__; "
        "print(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) - {'__main__'}))"
    )
    source_root = str(Path(prorl_server.__file__).parents[1])
    # -S: no site-packages at all, as in an image that has nothing but Python
    command = [sys.executable, "-S", "-c", code]
    out = subprocess.run(command, capture_output=True, text=True, check=True, env={"PYTHONPATH": source_root}).stdout
    assert out.strip() == "['prorl_server']"


async def test_ping_answers_right_after_start() -> None:
    started = time.perf_counter()
    server = start_server()
    try:
        client = ToolClient(server.socket_path)
        assert await client.wait_ready(timeout=10) == server.process.pid
        assert time.perf_counter() - started < 5.0  # the target (~30 ms) is measured by bench_tools.py
        assert os.stat(server.socket_path).st_mode & 0o777 == 0o600
        await client.aclose()
    finally:
        stop_server(server)


# --- bash -----------------------------------------------------------------------------------------


async def test_shell_keeps_cwd_variables_and_functions(tools: ToolClient, shared_server: RunningServer) -> None:
    first = await tools.bash('mkdir -p sub && cd sub && export GREETING=hello && greet() { echo "$1 $GREETING"; }')
    assert first.exit_code == 0 and not first.timed_out
    second = await tools.bash("pwd; greet world")
    assert second.output == f"{shared_server.workdir}/sub\nworld hello\n"
    await tools.bash(f"cd {shared_server.workdir}")


async def test_exit_code_of_the_last_command_is_returned(tools: ToolClient) -> None:
    assert (await tools.bash("true")).exit_code == 0
    assert (await tools.bash("false")).exit_code == 1
    failed = await tools.bash("echo partial; (exit 7)")
    assert (failed.output, failed.exit_code) == ("partial\n", 7)
    syntax = await tools.bash("if then")
    assert syntax.exit_code == 2 and "syntax error" in syntax.output


async def test_multiline_commands_and_heredocs_need_no_quoting(tools: ToolClient) -> None:
    result = await tools.bash("cat <<'EOF'\nit's \"quoted\" $HOME\nEOF\nfor i in 1 2; do\n  echo $i\ndone")
    assert result.output == 'it\'s "quoted" $HOME\n1\n2\n'


async def test_long_commands_and_unicode_pass_through(tools: ToolClient) -> None:
    result = await tools.bash(f"echo {'x' * 100_000} | wc -c; echo 'é ✓ 中'")  # longer than a terminal line
    assert result.output == "100001\né ✓ 中\n"


async def test_command_reading_stdin_sees_end_of_file(tools: ToolClient) -> None:
    result = await tools.bash("cat; read line; echo read=$?; python3 -c 'input()' 2>&1 | tail -1", timeout=10)
    assert not result.timed_out
    assert "read=1" in result.output and "EOFError" in result.output


@needs_ipython
async def test_shell_and_kernel_survive_their_private_files_being_deleted(own_server: RunningServer) -> None:
    tools = ToolClient(own_server.socket_path)
    await tools.bash('rm -rf "$TMPDIR"/prorl-tools-*')
    assert (await tools.bash("echo still here")).output == "still here\n"
    await tools.bash('rm -rf "$TMPDIR"/prorl-tools-*')
    assert (await tools.ipython("6 * 7", timeout=60)).output == "42\n"
    await tools.aclose()


async def test_pipes_behave_as_in_a_terminal(tools: ToolClient) -> None:
    result = await tools.bash("yes | head -n 2")
    assert (result.output, result.exit_code) == ("y\ny\n", 0)  # SIGPIPE ends `yes` silently


async def test_colours_and_carriage_returns_are_cleaned(tools: ToolClient) -> None:
    result = await tools.bash(r"printf 'a\r\nprogress 10%%\rprogress 100%%\n\033[31mred\033[0m\n'")
    assert result.output == "a\nprogress 100%\nred\n"


async def test_timeout_sends_ctrl_c_and_the_shell_survives(tools: ToolClient) -> None:
    await tools.bash("export KEEP=kept")
    result = await tools.bash("echo before; sleep 30", timeout=0.5)
    assert result.timed_out and result.exit_code is None
    assert result.output.startswith("before\n")
    assert result.duration_s < 3.0
    assert (await tools.bash("echo $KEEP")).output == "kept\n"


async def test_command_ignoring_ctrl_c_is_killed(tools: ToolClient) -> None:
    result = await tools.bash("export KEEP2=kept; (trap '' INT; exec sleep 30)", timeout=0.5)
    assert result.timed_out
    assert result.duration_s < 6.0
    assert (await tools.bash("echo $KEEP2")).output == "kept\n"


async def test_shell_that_never_comes_back_is_restarted(own_server: RunningServer) -> None:
    tools = ToolClient(own_server.socket_path)
    await tools.bash("export LOST=1")
    old_pid = int((await tools.bash("echo $$")).output)
    result = await tools.bash("trap '' INT; while :; do :; done", timeout=0.5)
    assert result.timed_out
    assert "the shell was killed" in result.output and "reset" in result.output
    assert wait_gone([old_pid]) == []
    after = await tools.bash("echo ${LOST:-unset} $$")
    assert after.output.split()[0] == "unset" and int(after.output.split()[1]) != old_pid
    await tools.aclose()


async def test_exit_starts_a_new_shell_next_time(own_server: RunningServer) -> None:
    tools = ToolClient(own_server.socket_path)
    result = await tools.bash("exit 3")
    assert result.exit_code == 3 and "the shell exited" in result.output
    assert (await tools.bash("echo again")).output == "again\n"
    await tools.aclose()


async def test_infinite_output_is_capped_without_waiting_for_the_end(tools: ToolClient) -> None:
    result = await tools.bash("yes", timeout=1.0, max_output=2000)
    assert result.timed_out and result.truncated
    assert len(result.output) < 2200
    assert result.duration_s < 5.0


async def test_truncation_keeps_head_and_tail_with_a_marker(tools: ToolClient) -> None:
    result = await tools.bash("seq 1 100000", max_output=1000)
    assert result.truncated and result.exit_code == 0
    assert result.output.startswith("1\n2\n3\n")
    assert result.output.endswith("99999\n100000\n")
    head, _, rest = result.output.partition("\n[... output truncated: ")
    omitted, _, tail = rest.partition(" more characters ...]\n")
    full = "".join(f"{i}\n" for i in range(1, 100001))
    assert (len(head), len(tail)) == (500, 500)
    assert int(omitted) == len(full) - 1000


async def test_small_output_is_not_truncated(tools: ToolClient) -> None:
    result = await tools.bash("seq 1 10", max_output=1000)
    assert not result.truncated and result.output == "".join(f"{i}\n" for i in range(1, 11))


# --- ipython --------------------------------------------------------------------------------------


@needs_ipython
async def test_ipython_keeps_state_between_cells(tools: ToolClient) -> None:
    first = await tools.ipython("import math\nx = 41\nprint('hi')\nx + 1", timeout=60)
    assert (first.output, first.exit_code, first.error_name) == ("hi\n42\n", 0, None)
    assert (await tools.ipython("math.floor(x / 2)")).output == "20\n"


@needs_ipython
async def test_ipython_error_comes_back_with_a_traceback(tools: ToolClient) -> None:
    result = await tools.ipython("def f():\n    return 1 / 0\nf()", timeout=60)
    assert result.exit_code == 1 and result.error_name == "ZeroDivisionError"
    assert "Traceback" in result.output and "ZeroDivisionError: division by zero" in result.output
    assert "\x1b[" not in result.output


@needs_ipython
async def test_ipython_timeout_interrupts_the_cell_and_keeps_state(tools: ToolClient) -> None:
    await tools.ipython("kept = 'yes'", timeout=60)
    result = await tools.ipython("import time\ntime.sleep(30)", timeout=0.5)
    assert result.timed_out and result.exit_code is None
    assert result.error_name == "KeyboardInterrupt"
    assert result.duration_s < 4.0
    assert (await tools.ipython("kept")).output == "'yes'\n"


@needs_ipython
async def test_ipython_input_does_not_hang(tools: ToolClient) -> None:
    result = await tools.ipython("input()", timeout=10)
    assert not result.timed_out and result.error_name == "StdinNotImplementedError"


# --- editor and files through the server ----------------------------------------------------------


async def test_editor_round_trip_with_relative_paths(tools: ToolClient, shared_server: RunningServer) -> None:
    created = await tools.edit("create", "pkg/mod.py", file_text="a = 1\nb = 2\n")
    assert created.success and (shared_server.workdir / "pkg/mod.py").read_text() == "a = 1\nb = 2\n"
    replaced = await tools.edit("str_replace", "pkg/mod.py", old_str="b = 2", new_str="b = 3")
    assert replaced.success and "     2\tb = 3" in replaced.output
    refused = await tools.edit("str_replace", "pkg/mod.py", old_str="c = 4", new_str="")
    assert not refused.success and "did not appear verbatim" in refused.output
    undone = await tools.edit("undo_edit", "pkg/mod.py")
    assert undone.success and (shared_server.workdir / "pkg/mod.py").read_text() == "a = 1\nb = 2\n"


async def test_upload_and_download_round_trip_binary_data(tools: ToolClient) -> None:
    data = bytes(range(256)) * 64 + os.urandom(1 << 20)
    assert await tools.upload("bin/blob.dat", data, mode=0o750) == len(data)
    assert await tools.download("bin/blob.dat") == data
    assert (await tools.bash("stat -c %a bin/blob.dat")).output == "750\n"


async def test_write_and_read_text_files(tools: ToolClient) -> None:
    text = "first\nsecond ✓\nthird\n"
    assert await tools.write_file("deep/er/notes.txt", text) == len(text.encode())
    assert await tools.read_file("deep/er/notes.txt") == text
    assert await tools.read_file("deep/er/notes.txt", offset=1, limit=1) == "second ✓\n"


async def test_missing_file_is_a_clear_error(tools: ToolClient) -> None:
    with pytest.raises(ToolError) as caught:
        await tools.read_file("no/such/file")
    assert caught.value.error == "FileNotFoundError" and "no/such/file" in caught.value.message


async def test_bad_requests_are_rejected_with_the_reason(tools: ToolClient) -> None:
    with pytest.raises(ToolError, match="unknown action") as caught:
        await tools.request("frobnicate")
    assert caught.value.error == "BadRequest"
    with pytest.raises(ToolError, match="needs the argument 'command'"):
        await tools.request("bash")
    with pytest.raises(ToolError, match="must be int or float"):
        await tools.request("bash", command="true", timeout="soon")
    with pytest.raises(ToolError, match="unknown argument"):
        await tools.request("ping", extra=1)


# --- the client across loops and threads ----------------------------------------------------------


def test_one_client_works_from_several_event_loops_and_threads(shared_server: RunningServer) -> None:
    client = asyncio.run(make_client(shared_server.socket_path))  # created on a loop that is then closed
    results: dict[str, str] = {}

    def use(name: str) -> None:
        results[name] = asyncio.run(client.bash(f"echo {name}")).output

    threads = [threading.Thread(target=use, args=(f"loop{i}",), name=f"test-loop-{i}") for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    use("main")
    assert results == {name: f"{name}\n" for name in ("loop0", "loop1", "loop2", "main")}
    asyncio.run(client.aclose())


async def make_client(socket_path: str) -> ToolClient:
    """A client that made one call on the current loop."""
    client = ToolClient(socket_path)
    await client.ping()
    return client


async def test_concurrent_calls_on_one_client_are_all_answered(tools: ToolClient) -> None:
    commands = [tools.bash(f"sleep 0.05; echo {i}") for i in range(5)]
    files = [tools.write_file(f"concurrent/{i}.txt", str(i)) for i in range(5)]
    pings = [tools.ping() for _ in range(5)]
    results = await asyncio.gather(*commands, *files, *pings)
    assert [r.output for r in results[:5]] == [f"{i}\n" for i in range(5)]
    assert results[5:10] == [1] * 5


async def test_waiting_for_the_busy_shell_counts_against_the_timeout(tools: ToolClient) -> None:
    long = asyncio.create_task(tools.bash("sleep 1.5", timeout=5))
    await asyncio.sleep(0.2)
    queued = await tools.bash("echo late", timeout=0.3)
    assert queued.timed_out and "busy" in queued.output
    assert (await long).exit_code == 0


# --- stopping, dying, hanging ---------------------------------------------------------------------


async def children_of_a_busy_server(tools: ToolClient) -> list[int]:
    """PIDs of the shell, a background job, the kernel and a kernel child."""
    shell = int((await tools.bash("echo $$")).output)
    job = int((await tools.bash("sleep 1000 & echo $!")).output)
    kernel = int((await tools.ipython("import os, subprocess\nos.getpid()", timeout=60)).output)
    child = int((await tools.ipython("subprocess.Popen(['sleep', '1000']).pid")).output)
    assert all(alive(p) for p in (shell, job, kernel, child))
    return [shell, job, kernel, child]


@needs_ipython
async def test_shutdown_leaves_no_child_process(own_server: RunningServer) -> None:
    tools = ToolClient(own_server.socket_path)
    pids = await children_of_a_busy_server(tools)
    await tools.shutdown()
    assert own_server.process.wait(10) == 0
    assert wait_gone(pids) == []
    assert not os.path.exists(own_server.socket_path)


@needs_ipython
async def test_sigterm_leaves_no_child_process(own_server: RunningServer) -> None:
    tools = ToolClient(own_server.socket_path)
    pids = await children_of_a_busy_server(tools)
    own_server.process.terminate()
    assert own_server.process.wait(10) == 0
    assert wait_gone(pids) == []
    await tools.aclose()


async def test_sigterm_during_a_running_command_stops_promptly(own_server: RunningServer) -> None:
    tools = ToolClient(own_server.socket_path)
    shell = int((await tools.bash("echo $$")).output)
    running = asyncio.create_task(tools.bash("sleep 1000"))
    await asyncio.sleep(0.3)
    own_server.process.terminate()
    assert own_server.process.wait(10) == 0
    assert wait_gone([shell]) == []
    try:
        result = await running
    except ToolError as exc:  # the server exited before answering
        assert exc.error == "SandboxGone"
    else:  # the server answered while stopping: the shell it was reading from went away
        assert "the shell exited" in result.output and result.exit_code is None
    await tools.aclose()


async def test_dead_server_is_reported_as_sandbox_gone(own_server: RunningServer) -> None:
    tools = ToolClient(own_server.socket_path)
    await tools.bash("true")  # leaves a pooled connection to the server
    own_server.process.kill()
    own_server.process.wait()
    started = time.monotonic()
    for _ in range(2):  # first on the pooled connection, then on a fresh connect
        with pytest.raises(ToolError) as caught:
            await tools.bash("true")
        assert caught.value.error == "SandboxGone"
    assert time.monotonic() - started < 2.0
    await tools.aclose()


async def test_missing_socket_is_reported_as_sandbox_gone(tmp_path: Path) -> None:
    with pytest.raises(ToolError) as caught:
        await ToolClient(str(tmp_path / "nothing.sock")).ping()
    assert caught.value.error == "SandboxGone" and "nothing.sock" in caught.value.message


async def test_hung_server_hits_the_client_deadline(own_server: RunningServer) -> None:
    tools = ToolClient(own_server.socket_path, request_timeout=0.5)
    await tools.ping()
    own_server.process.send_signal(signal.SIGSTOP)
    stat = Path(f"/proc/{own_server.process.pid}/stat")
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "T":  # the stop takes effect asynchronously
        await asyncio.sleep(0.01)
    try:
        started = time.monotonic()
        with pytest.raises(ToolError) as caught:
            await tools.ping()
        assert caught.value.error == "Timeout"
        assert time.monotonic() - started < 2.0
    finally:
        own_server.process.send_signal(signal.SIGCONT)
    assert await tools.ping() == own_server.process.pid  # the timed-out connection was dropped, not reused
    await tools.aclose()


async def test_closed_client_refuses_calls(shared_server: RunningServer) -> None:
    tools = ToolClient(shared_server.socket_path)
    await tools.aclose()
    with pytest.raises(ToolError, match="ClientClosed"):
        await tools.ping()


@pytest.mark.skipif(not importlib.util.find_spec("jupyter_client"), reason="needs jupyter_client")
def test_a_server_without_site_finds_jupyter_client_in_site_packages_on_first_use():
    # a sandbox's server runs with -I -S (no site-packages scan at start); IPython's first call adds them
    src = str(Path(prorl_server.__file__).resolve().parent.parent)
    code = (
        f"import sys; sys.path.insert(0, {src!r})\n"
        "assert 'site' not in sys.modules and not any('site-packages' in p for p in sys.path)\n"
        "from prorl_server.tool_server.ipython_kernel import import_jupyter_client\n"
        "client, write = import_jupyter_client()\n"
        "print(client.__name__, write.__name__)\n"
    )
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["BlockingKernelClient", "write_connection_file"]
