"""HarborHandler: INIT builds the task's image, RUN gives the agent the instruction in a sandbox of it, EVAL
runs tests/test.sh in a fresh sandbox of it holding the agent's working directory, and reads the reward."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import shlex
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prorl_handlers.harbor.image import TaskImage, build, conversion, unpack_command
from prorl_handlers.harbor.instance import AGENT_DIR, HarborInstance
from prorl_handlers.harbor.task import HarborTask, fingerprint, load_task, task_path
from prorl_handlers.harnesses.sandbox import harness_sandbox, session_defaults
from prorl_server import AgentHandler, JobContext
from prorl_server.agent import AgentLoop, bash_tool, editor_tool, submit_tool
from prorl_server.imaging import DEFAULTS, IMAGE_CACHE_DIR, ImageBuilder, parse_mapping
from prorl_server.sandbox import Bind, Sandbox, SandboxLimits, SandboxSpec
from prorl_server.tool_server.errors import FileSystemError
from prorl_server.tool_server.files import MAX_DOWNLOAD_BYTES

ENV_TASKS_DIR = "PRORL_HARBOR_TASKS"
ENV_BASE_MAP = "PRORL_HARBOR_BASE_MAP"
ENV_CACHE_DIR = "PRORL_HARBOR_CACHE_DIR"
ENV_MIRROR = "PRORL_HARBOR_MIRROR"
SNAPSHOT = "/tmp/prorl-harbor-workspace.tar.gz"
SNAPSHOT_TIMEOUT_S = 300.0
VERIFIER_DIR = "/logs/verifier"
MAX_REWARD_BYTES = 1 << 16
OUTPUT_TAIL_CHARS = 4000
DEFAULT_MAX_TURNS = 30
INSTRUCTIONS = (
    "You are an agent in a Linux sandbox without network access. Complete the task you are given with the "
    "tools: inspect and change files, run commands. When the task is done, call submit."
)


class HarborHandler(AgentHandler):
    """Harbor / Terminal-Bench task folders as tasks (see `prorl_handlers.harbor`).

    Server-side settings, from the constructor or, for `--handler` and the entry point, the environment:
    `tasks_dir` ($PRORL_HARBOR_TASKS, required), `base_map` ($PRORL_HARBOR_BASE_MAP, `IMAGE=PATH` pairs
    separated by spaces: a Dockerfile's FROM mapped to a local .sif or root directory), `cache_dir`
    ($PRORL_HARBOR_CACHE_DIR, default the image cache) and `mirror` ($PRORL_HARBOR_MIRROR, the Debian mirror
    of a debootstrapped FROM). Agent settings of the loop: `max_turns` (30), `max_context_length`,
    `tool_timeout`, `system_prompt`.
    """

    name = "harbor"
    instance_model = HarborInstance

    def __init__(
        self,
        tasks_dir: str | Path | None = None,
        base_map: Mapping[str, str | Path] | None = None,
        cache_dir: str | Path | None = None,
        mirror: str | None = None,
    ) -> None:
        tasks_dir = tasks_dir or os.environ.get(ENV_TASKS_DIR)
        self.tasks_dir = Path(tasks_dir) if tasks_dir else None
        if base_map is None:
            base_map = parse_mapping(os.environ.get(ENV_BASE_MAP, "").split(), ENV_BASE_MAP)
        self.base_map = {image: Path(path) for image, path in base_map.items()}
        self.cache_dir = Path(cache_dir or os.environ.get(ENV_CACHE_DIR) or IMAGE_CACHE_DIR)
        self.mirror = mirror or os.environ.get(ENV_MIRROR) or DEFAULTS["mirror"]
        submit = submit_tool(description="Say that the task is done; this ends the episode.")
        self.loop = AgentLoop([bash_tool(), editor_tool(), submit], INSTRUCTIONS, max_turns=DEFAULT_MAX_TURNS)

    def validate_instance(self, instance: dict[str, Any]) -> None:
        """The instance's fields, then its task folder: its files, task.toml and Dockerfile (cached while
        those files are unchanged)."""
        request = HarborInstance.model_validate(instance)
        tasks_dir = self._tasks_dir()
        path = task_path(tasks_dir, request.task)
        _check(tasks_dir, request.task, request.agent == "oracle", fingerprint(path), tuple(self.base_map.items()))

    def init(self, ctx: JobContext) -> None:
        """Read the task and build its image (cached; a plain def: the build blocks this worker thread)."""
        request = HarborInstance.model_validate(ctx.instance)
        task = load_task(self._tasks_dir(), request.task, oracle=request.agent == "oracle")
        image = build(ImageBuilder(cache_dir=self.cache_dir), task, self.base_map, self.mirror)
        ctx.state.update(request=request, task=task, image=image)
        ctx.artifacts["image"] = {"cached": image.cached, "seconds": round(image.seconds, 3)}

    async def run(self, ctx: JobContext) -> None:
        """The agent on the instruction in a sandbox of the image, within the task's agent timeout; then its
        working directory is packed for EVAL."""
        request: HarborInstance = ctx.state["request"]
        task: HarborTask = ctx.state["task"]
        image: TaskImage = ctx.state["image"]
        config = task.config
        env, binds = dict(config.environment.env), []
        if request.agent == "oracle":
            binds.append(Bind(source=str(await self._host_copy(ctx, task.solution)), target="/solution"))
            env.update({"DEBIAN_FRONTEND": "noninteractive", **config.solution.env})
        elif request.agent == "command":
            env["HARBOR_INSTRUCTION"] = task.instruction
        spec, setup = _spec(task, image, env, binds), None
        if request.agent == "harness":
            access = await ctx.gateway_session(**session_defaults(str(request.harness)))
            max_turns = int(ctx.agent_config.get("max_turns") or DEFAULT_MAX_TURNS)
            setup = harness_sandbox(str(request.harness), spec, task.instruction, access, max_turns)
            sandbox = await ctx.start_sandbox(setup.spec, gateway=access)
        elif request.agent == "command":
            sandbox = await ctx.start_sandbox(spec, gateway=await ctx.gateway_session())
        else:
            sandbox = await ctx.start_sandbox(spec)
        await _bash(sandbox, unpack_command(image.workdir), "unpacking the working directory")
        if setup is not None:
            await setup.prepare(sandbox)
        timeout = config.agent.timeout_sec
        if request.agent == "loop":
            try:
                async with asyncio.timeout(timeout):
                    await self.loop.run(ctx, task.instruction)
            except TimeoutError:
                ctx.artifacts["agent_timed_out"] = True
        else:
            for path, text in request.files.items():
                await sandbox.write_file(f"{AGENT_DIR}/{path}", text)
            if setup is not None:
                command = setup.command
            else:
                command = "bash /solution/solve.sh" if request.agent == "oracle" else str(request.command)
            done = await sandbox.bash(command, timeout=timeout, dop=(1, config.environment.cpus))
            ctx.artifacts["agent"] = {
                "exit_code": done.exit_code,
                "timed_out": done.timed_out,
                "output": done.output[-OUTPUT_TAIL_CHARS:],
            }
            if setup is not None:
                ctx.artifacts["harness"] = await setup.report(sandbox)
        ctx.state["workspace"] = await _snapshot(sandbox, image.workdir)

    async def eval(self, ctx: JobContext) -> dict[str, Any]:
        """tests/test.sh in a fresh sandbox of the image holding the agent's working directory; the reward
        from /logs/verifier/reward.json (its "reward"), else reward.txt, as Harbor reads them."""
        task: HarborTask = ctx.state["task"]
        image: TaskImage = ctx.state["image"]
        workspace: bytes | str = ctx.state["workspace"]
        if isinstance(workspace, str):
            return {"reward": 0.0, "error": workspace}
        config = task.config
        logs = self._logs_dir(ctx)
        binds = [
            Bind(source=str(await self._host_copy(ctx, task.tests)), target="/tests"),
            Bind(source=str(logs), target="/logs", read_only=False),
        ]
        sandbox = await ctx.start_sandbox(_spec(task, image, {**config.environment.env, **config.verifier.env}, binds))
        await sandbox.tools.upload(SNAPSHOT, workspace)
        await _bash(
            sandbox, f"{unpack_command(image.workdir, SNAPSHOT)} && rm -f {SNAPSHOT}", "unpacking the workspace"
        )
        done = await sandbox.bash(
            f"bash /tests/test.sh > {VERIFIER_DIR}/test-stdout.txt 2>&1",
            timeout=config.verifier.timeout_sec,
            dop=(1, config.environment.cpus),
            kind="tests",
        )
        details: dict[str, Any] = {"tests_exit_code": done.exit_code, "tests_timed_out": done.timed_out}
        output = await _read(sandbox, f"{VERIFIER_DIR}/test-stdout.txt", MAX_DOWNLOAD_BYTES)
        details["test_output"] = (output or "")[-OUTPUT_TAIL_CHARS:]
        if done.timed_out:
            return {"reward": 0.0, "error": f"tests/test.sh ran past {config.verifier.timeout_sec:g} s", **details}
        rewards, error = await _rewards(sandbox)
        if error is not None:
            return {"reward": 0.0, "error": error, **details}
        return {"reward": rewards["reward"], "rewards": rewards, **details}

    def _tasks_dir(self) -> Path:
        if self.tasks_dir is None:
            raise ValueError(f"this server has no Harbor tasks directory: set ${ENV_TASKS_DIR} (or tasks_dir=)")
        return self.tasks_dir

    def _job_dir(self, ctx: JobContext) -> Path:
        """A host directory for the job's binds, removed on release (under the cache, where apptainer sees it)."""
        parent = self.cache_dir / "harbor-jobs"
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix=f"{ctx.job_id[:32]}-", dir=parent))
        ctx.on_release(functools.partial(shutil.rmtree, path, ignore_errors=True))
        path.chmod(0o755)
        return path

    async def _host_copy(self, ctx: JobContext, source: Path) -> Path:
        """A copy of a task's folder that the sandbox's user may read (links kept as links)."""
        target = self._job_dir(ctx) / source.name
        await asyncio.to_thread(_readable_copy, source, target)
        return target

    def _logs_dir(self, ctx: JobContext) -> Path:
        """/logs for the tests: verifier/ and agent/ writable by the sandbox's user, /logs itself not."""
        logs = self._job_dir(ctx) / "logs"
        for name in ("verifier", "agent"):
            (logs / name).mkdir(parents=True)
            (logs / name).chmod(0o777)
        logs.chmod(0o755)
        return logs


def _readable_copy(source: Path, target: Path) -> None:
    """Copy a folder (links kept as links) and make everything in it readable by anyone."""
    shutil.copytree(source, target, symlinks=True)
    for top, dirs, files in os.walk(target):
        for name in dirs + files:
            path = Path(top, name)
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))
    target.chmod(0o755)


@functools.lru_cache(maxsize=1024)
def _check(
    tasks_dir: Path, name: str, oracle: bool, stamps: tuple[Any, ...], base_map: tuple[tuple[str, Path], ...]
) -> None:
    """Read the task and convert its Dockerfile; raises what is wrong (`stamps` and `base_map`: the cache key)."""
    conversion(load_task(tasks_dir, name, oracle=oracle), dict(base_map))


def _spec(task: HarborTask, image: TaskImage, env: dict[str, str], binds: list[Bind]) -> SandboxSpec:
    """A sandbox of the task's image in its working directory, with the task's cpus, memory and storage."""
    resources = task.config.environment
    limits = SandboxLimits(cpus=resources.cpus, memory_mb=resources.memory_mb, disk_mb=resources.storage_mb)
    return SandboxSpec(image=str(image.root), workdir=image.workdir, env=env, binds=binds, limits=limits)


async def _bash(sandbox: Sandbox, command: str, what: str) -> None:
    """Run one of the handler's own commands; RuntimeError with its output if it fails."""
    done = await sandbox.bash(f"( {command} )", timeout=SNAPSHOT_TIMEOUT_S)
    if done.exit_code != 0:
        raise RuntimeError(f"{what} failed (exit code {done.exit_code}): {done.output[-OUTPUT_TAIL_CHARS:]}")


async def _snapshot(sandbox: Sandbox, workdir: str) -> bytes | str:
    """The working directory as a gzipped tar, or why it cannot go to EVAL."""
    quoted = shlex.quote(workdir)
    done = await sandbox.bash(f"( tar -C {quoted} -czf {SNAPSHOT} . && stat -c %s {SNAPSHOT} )", SNAPSHOT_TIMEOUT_S)
    size = done.output.strip().rpartition("\n")[2]
    if done.exit_code != 0 or not size.isdigit():
        return f"packing the working directory {workdir} failed: {done.output[-OUTPUT_TAIL_CHARS:]}"
    if int(size) > MAX_DOWNLOAD_BYTES:
        return f"the working directory {workdir} is {int(size) >> 20} MiB packed, over {MAX_DOWNLOAD_BYTES >> 20} MiB"
    return await sandbox.tools.download(SNAPSHOT)


async def _read(sandbox: Sandbox, path: str, limit: int) -> str | None:
    """A file's text in the sandbox (None if missing, not a file, or over `limit` bytes)."""
    size = await sandbox.bash(f"stat -L -c %s -- {shlex.quote(path)}", timeout=SNAPSHOT_TIMEOUT_S)
    if size.exit_code != 0 or not size.output.strip().isdigit() or int(size.output.strip()) > limit:
        return None
    try:
        return (await sandbox.tools.download(path)).decode(errors="replace")
    except FileSystemError:
        return None


async def _rewards(sandbox: Sandbox) -> tuple[dict[str, float], str | None]:
    """Harbor's reading of the verifier's files: reward.json (its numeric values; "reward" from reward.txt
    when it has none), else reward.txt (one number). The rewards, or why there is no reward."""
    text = await _read(sandbox, f"{VERIFIER_DIR}/reward.txt", MAX_REWARD_BYTES)
    raw = await _read(sandbox, f"{VERIFIER_DIR}/reward.json", MAX_REWARD_BYTES)
    rewards: dict[str, float] = {}
    if raw is not None:
        try:
            parsed = json.loads(raw)
        except ValueError:
            return {}, f"{VERIFIER_DIR}/reward.json is not JSON"
        if not isinstance(parsed, dict):
            return {}, f"{VERIFIER_DIR}/reward.json is not an object"
        rewards = {
            key: float(value)
            for key, value in parsed.items()
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        }
        if "reward" in rewards:
            return rewards, None
    if text is None and raw is None:
        return {}, f"tests/test.sh wrote neither {VERIFIER_DIR}/reward.txt nor reward.json"
    if text is None:
        return {}, f"{VERIFIER_DIR}/reward.json has no numeric 'reward', and there is no reward.txt"
    try:
        reward = float(text.strip())
    except ValueError:
        return {}, f"{VERIFIER_DIR}/reward.txt holds {text.strip()[:100]!r}, not a number"
    if not math.isfinite(reward):
        return {}, f"{VERIFIER_DIR}/reward.txt holds {reward}, not a finite number"
    return {**rewards, "reward": reward}, None
