"""bench_groups.py's sandbox part: INIT of one group with a SWE-like INIT on real sandboxes, each member running
its own INIT (today) against INIT once and a copy-on-write fork per member (`fork_after_init`).

The INIT (`INSTALL`): copy a repository of `files` source files into the working directory and commit it
with git, then `pip install` `packages` pure-Python wheels of `modules` modules each (made here, installed
with `--no-index` from a read-only bind, compiled to bytecode as pip does) into the working directory. RUN
imports two of the installed packages and checks the checkout has no changes, so a fork that lost INIT's
files fails. The server runs in this process with the bubblewrap runtime (the host's system directories
read-only, the source directory bound read-only at /src) and the simulator as its LLM backend (no member
calls it).

Figures per arm (`today`, `fork`), for one group of `group_size` members posted at once, next to the INIT of
one member alone (a job through `POST /process`, the baseline):

- `group_init_s`: from the group's post until the last member's RUN started (its INIT, or wait and fork, done);
- `ratio`: group_init_s / the one member's INIT seconds (target for `fork`: <= 1.5);
- `inits`: how many times the handler's INIT ran; `init_work_s`: the seconds those INITs took;
- `init_stage_s`: the members' INIT stage seconds summed (`timing.init_s`; a fork's includes waiting for the
  group's INIT, holding no sandbox);
- `sandbox_s`: sandbox-seconds, each sandbox's life from its start to its close (or snapshot), summed.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import shutil
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx

from prorl_server.api.app import create_app
from prorl_server.api.state import ServerState
from prorl_server.config import ServerSettings
from prorl_server.handlers import AgentHandler, HandlerRegistry, JobContext
from prorl_server.sandbox import Bind, Sandbox, SandboxLimits, SandboxManager, SandboxSpec
from prorl_server.sandbox.snapshot import Snapshot
from prorl_server.simllm import SimLLMServer
from prorl_server.testing.uvicorn_thread import UvicornThread

TODAY, FORK = "swe_init_today", "swe_init_fork"
INSTALL = """set -e
cp -r /src/repo /workspace/repo
cd /workspace/repo
git init -q && git add -A && git -c user.name=bench -c user.email=bench@bench commit -q -m base
python3 -m pip install -q --no-index --no-cache-dir --disable-pip-version-check --find-links /src/wheels \\
    --target /workspace/deps {packages}
"""
CHECK = (
    'cd /workspace/repo && test -z "$(git status --short)" && '
    "PYTHONPATH=/workspace/deps python3 -c 'import pkg0, pkg{last}; print(pkg0.VALUE + pkg{last}.VALUE)'"
)


def _module(package: int, index: int) -> str:
    functions = "\n\n".join(
        f"def f{j}(x: int) -> int:\n    return (x * {j + 3} + {package}) % {index + 101}" for j in range(40)
    )
    return f'"""Module {index} of pkg{package}."""\n\nCONSTANT = {index}\n\n{functions}\n'


def _wheel(directory: Path, package: int, modules: int) -> None:
    """A pure-Python wheel `pkg<package>` of `modules` modules, with a RECORD pip checks."""
    name, files = f"pkg{package}", {}
    files[f"{name}/__init__.py"] = f"VALUE = {package}\n"
    for index in range(modules):
        files[f"{name}/mod{index}.py"] = _module(package, index)
    info = f"{name}-1.0.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
    files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: bench_groups\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(directory / f"{name}-1.0-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


def make_source(files: int, packages: int, modules: int) -> Path:
    """A directory (readable by the sandbox's user) with `repo/` (`files` source files) and `wheels/`."""
    root = Path(tempfile.mkdtemp(prefix="bench-groups-swe-"))
    root.chmod(0o755)
    repo, wheels = root / "repo", root / "wheels"
    for index in range(files):
        path = repo / f"pkg{index % 10}" / f"file{index}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_module(0, index))
    wheels.mkdir()
    for package in range(packages):
        _wheel(wheels, package, modules)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


class SweInitHandler(AgentHandler):
    """INIT: the repository checkout and the dependency install (`INSTALL`); RUN: `CHECK`; EVAL: 1.0. Records
    how many INITs ran, their seconds, and when each member's RUN started."""

    name = TODAY

    def __init__(self, source: Path, packages: int) -> None:
        self.source = source
        self.packages = packages
        self.lock = threading.Lock()
        self.inits = 0
        self.init_work_s = 0.0
        self.run_started: dict[str, float] = {}

    async def init(self, ctx: JobContext) -> None:
        started = time.monotonic()
        spec = SandboxSpec(binds=[Bind(source=str(self.source), target="/src")], limits=SandboxLimits(disk_mb=1024))
        sandbox = await ctx.start_sandbox(spec)
        names = " ".join(f"pkg{i}" for i in range(self.packages))
        done = await sandbox.bash(INSTALL.format(packages=names), timeout=600)
        if done.exit_code != 0:
            raise RuntimeError(f"the SWE-like INIT failed: {done.output[-2000:]}")
        with self.lock:
            self.inits += 1
            self.init_work_s += time.monotonic() - started

    async def run(self, ctx: JobContext) -> None:
        with self.lock:
            self.run_started[ctx.job_id] = time.monotonic()
        done = await ctx.sandbox.bash(CHECK.format(last=self.packages - 1), timeout=120)
        if done.exit_code != 0:
            raise RuntimeError(f"INIT's checkout or install is not there: {done.output[-2000:]}")

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


class ForkingSweInitHandler(SweInitHandler):
    """The same INIT, run once per group; every member starts from a fork of it."""

    name = FORK
    fork_after_init = True


class TimedSandboxes(SandboxManager):
    """A SandboxManager that also sums each sandbox's life, from its start to its close or snapshot."""

    def __init__(self, manager: SandboxManager) -> None:
        super().__init__(manager.runtime, manager.owner, manager.default_spec, manager.base_dir)
        self.on_start, self.on_tool_request = manager.on_start, manager.on_tool_request
        self.seconds = 0.0
        self._opened: dict[int, float] = {}
        self._clock = threading.Lock()

    async def _track(self, starting: Any) -> Sandbox:
        started = time.monotonic()
        sandbox = await super()._track(starting)
        with self._clock:
            self._opened[id(sandbox)] = started
        return sandbox

    def _ended(self, sandbox: Sandbox) -> None:
        with self._clock:
            started = self._opened.pop(id(sandbox), None)
            if started is not None:
                self.seconds += time.monotonic() - started

    async def close(self, sandbox: Sandbox) -> None:
        try:
            await super().close(sandbox)
        finally:
            self._ended(sandbox)

    async def snapshot(self, sandbox: Sandbox) -> Snapshot:
        try:
            return await super().snapshot(sandbox)
        finally:
            self._ended(sandbox)


async def _group(
    http: httpx.AsyncClient, state: ServerState, handler: SweInitHandler, size: int, group_id: str
) -> dict[str, float]:
    sandboxes = state.orchestrator.sandboxes
    assert isinstance(sandboxes, TimedSandboxes)
    inits, work, seconds = handler.inits, handler.init_work_s, sandboxes.seconds
    posted = time.monotonic()
    body = {"instance": {"data_source": handler.name}, "n": size, "group_id": group_id, "timeout": 1200}
    group = (await http.post("/groups", json=body)).raise_for_status().json()
    if group["status"] != "completed":
        errors = [(await http.get(f"/jobs/{m['job_id']}")).json()["result"]["error"] for m in group["members"]]
        raise RuntimeError(f"group {group_id} {group['status']}: {errors}")
    results = [(await http.get(f"/jobs/{m['job_id']}")).json()["result"] for m in group["members"]]
    return {
        "group_init_s": max(handler.run_started[m["job_id"]] for m in group["members"]) - posted,
        "inits": handler.inits - inits,
        "init_work_s": handler.init_work_s - work,
        "init_stage_s": sum(r["timing"]["init_s"] for r in results),
        "sandbox_s": sandboxes.seconds - seconds,
    }


async def _measure(url: str, state: ServerState, handlers: dict[str, SweInitHandler], size: int) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=1500, trust_env=False) as http:
        alone = (await http.post("/process", json={"instance": {"data_source": TODAY}, "timeout": 1200})).json()
        if alone["status"] != "completed":
            raise RuntimeError(f"the one-member INIT failed: {alone['error']}")
        one = alone["timing"]["init_s"]
        arms = {}
        for arm, data_source in (("today", TODAY), ("fork", FORK)):
            arms[arm] = await _group(http, state, handlers[data_source], size, f"init-{arm}")
            arms[arm]["ratio"] = arms[arm]["group_init_s"] / one
    return {"one_member_init_s": one, "arms": arms}


def run_init_part(size: int, files: int, packages: int, modules: int, runtime: str = "bwrap") -> dict[str, Any]:
    """The sandbox part (see the module docstring): {"runtime", "group_size", "one_member_init_s", "arms"}.
    RuntimeError when the runtime cannot fork (the comparison would be today against today)."""
    source = make_source(files, packages, modules)
    sim = SimLLMServer(time_scale=1.0)
    handlers = {TODAY: SweInitHandler(source, packages), FORK: ForkingSweInitHandler(source, packages)}
    registry = HandlerRegistry()
    for name, handler in handlers.items():
        registry.register(name, handler)
    server: UvicornThread | None = None
    try:
        sim.start()
        settings = ServerSettings(llm_servers=[sim.address], runtime=runtime, init_workers=2 * size, run_workers=size)
        state = ServerState.build(settings, registry=registry)
        manager = state.orchestrator.sandboxes
        if manager is None or manager.runtime.fork_unavailable() is not None:
            reason = "no sandbox runtime" if manager is None else manager.runtime.fork_unavailable()
            raise RuntimeError(f"the {runtime} runtime cannot fork here: {reason}")
        state.orchestrator.sandboxes = TimedSandboxes(manager)
        server = UvicornThread(create_app(state=state)).start()
        figures = asyncio.run(_measure(server.url, state, handlers, size))
    finally:
        if server is not None:
            server.stop()
        sim.stop()
        shutil.rmtree(source, ignore_errors=True)
    return {"runtime": runtime, "group_size": size, **figures}
