"""SWEHandler: INIT checks the repository out in a sandbox, RUN lets the agent fix it and takes its `git diff`,
EVAL applies that diff in a fresh sandbox and runs the instance's tests."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prorl_handlers.swe.evaluate import evaluate
from prorl_handlers.swe.instance import DATA_DIR, SWEInstance
from prorl_handlers.swe.repo import RepositoryError, extract_patch, materialize, repo_dir
from prorl_server import AgentHandler, JobContext
from prorl_server.agent import AgentLoop, bash_tool, editor_tool, submit_tool
from prorl_server.imaging import (
    DEFAULTS,
    IMAGE_CACHE_DIR,
    BuildQueue,
    ImageBuilder,
    ImageCache,
    ImageSpec,
    InstanceImage,
    InstanceImages,
    parse_mapping,
)
from prorl_server.sandbox import Sandbox, SandboxSpec, unpack_sif

REPOS_DIR = DATA_DIR / "repos"
ENV_DATASET_DIR = "PRORL_SWE_DATASET_DIR"
ENV_BASE_MAP = "PRORL_SWE_BASE_MAP"
ENV_CACHE_DIR = "PRORL_SWE_CACHE_DIR"
ENV_CACHE_BUDGET_GB = "PRORL_SWE_CACHE_BUDGET_GB"
ENV_BUILD_CONCURRENCY = "PRORL_SWE_BUILD_CONCURRENCY"
ENV_MIRROR = "PRORL_SWE_MIRROR"
DEFAULT_BUILD_CONCURRENCY = 2
DEFAULT_MAX_TURNS = 30
DEFAULT_TEST_TIMEOUT_S = 300.0
INSTRUCTIONS = (
    "You are a software engineer fixing an issue in a Python repository, in a sandbox without network access. "
    "Explore the code with the tools, find the cause of the issue and fix it in the source code; run "
    "`python3 -m pytest` to check your work. Hidden tests will check the fix, so keep every behaviour the issue "
    "does not ask to change. When you are done, call submit: your answer is your changes to the repository."
)


def task_prompt(task: SWEInstance) -> str:
    """The first user message: where the repository is, and the issue."""
    return (
        f"The repository {task.repo} is checked out at {task.workdir} (git, commit {task.base_commit[:12]}). "
        f"Resolve this issue:\n\n<issue>\n{task.problem_statement.strip()}\n</issue>"
    )


class SWEHandler(AgentHandler):
    """Repository repair, SWE-bench style, on repositories shipped with the package (see `prorl_handlers.swe`).

    In a group, INIT (the instance's image and the checkout) runs once and each member starts from a
    copy-on-write fork of the checked-out sandbox (`fork_after_init`; where the runtime forks).

    Agent settings: `max_turns` (default 30), `max_context_length`, `tool_timeout`, `system_prompt`, and
    `test_timeout` (seconds for EVAL's test run, default 300). Where repositories are is the server's
    choice, not a request's: the constructor's `repos_dir` (default: the shipped ones). An instance's own
    image (its `dockerfile` and `base_dockerfile`, relative to `dataset_dir`) is built with these server-side
    settings, from the constructor or, for `--handler` and the entry point, the environment: `dataset_dir`
    ($PRORL_SWE_DATASET_DIR, default the shipped data/), `base_map` ($PRORL_SWE_BASE_MAP, `IMAGE=PATH` pairs
    separated by spaces), `cache_dir` ($PRORL_SWE_CACHE_DIR, default the image cache), `cache_budget_gb`
    ($PRORL_SWE_CACHE_BUDGET_GB, default none), `build_concurrency` ($PRORL_SWE_BUILD_CONCURRENCY, default 2)
    and `mirror` ($PRORL_SWE_MIRROR).
    """

    name = "swe"
    agent_config_keys = frozenset({"test_timeout"})
    fork_after_init = True  # a group checks out (and builds the image) once; its members fork that sandbox

    def __init__(
        self,
        repos_dir: str | Path | None = None,
        dataset_dir: str | Path | None = None,
        base_map: Mapping[str, str | Path] | None = None,
        cache_dir: str | Path | None = None,
        cache_budget_gb: float | None = None,
        build_concurrency: int | None = None,
        mirror: str | None = None,
    ) -> None:
        self.repos_dir = Path(repos_dir) if repos_dir else REPOS_DIR
        self.dataset_dir = Path(dataset_dir or os.environ.get(ENV_DATASET_DIR) or DATA_DIR)
        if base_map is None:
            base_map = parse_mapping(os.environ.get(ENV_BASE_MAP, "").split(), ENV_BASE_MAP)
        self.base_map = {image: Path(path) for image, path in base_map.items()}
        self.cache_dir = Path(cache_dir or os.environ.get(ENV_CACHE_DIR) or IMAGE_CACHE_DIR)
        budget = os.environ.get(ENV_CACHE_BUDGET_GB) if cache_budget_gb is None else cache_budget_gb
        self.cache_budget_bytes = None if budget is None else int(float(budget) * (1 << 30))
        concurrency = build_concurrency or os.environ.get(ENV_BUILD_CONCURRENCY) or DEFAULT_BUILD_CONCURRENCY
        self.build_concurrency = int(concurrency)
        self.mirror = mirror or os.environ.get(ENV_MIRROR) or DEFAULTS["mirror"]
        self._images: InstanceImages | None = None
        self._images_lock = threading.Lock()  # INIT and EVAL run on threads of their own
        tools = [bash_tool(), editor_tool(), submit_tool(description="Submit your fix; this ends the episode.")]
        self.loop = AgentLoop(tools, INSTRUCTIONS, max_turns=DEFAULT_MAX_TURNS)

    def images(self) -> InstanceImages:
        """The instance images' builder, queue and cache (made on first use: a server without images never
        touches the image cache)."""
        with self._images_lock:
            if self._images is None:
                builder = ImageBuilder(cache_dir=self.cache_dir)
                cache = ImageCache(self.cache_dir, self.cache_budget_bytes)
                queue: BuildQueue[InstanceImage] = BuildQueue(self.build_concurrency)
                self._images = InstanceImages(builder, queue, cache, self.base_map, self.mirror)
            return self._images

    def validate_instance(self, instance: dict[str, Any]) -> None:
        """The instance's fields, and its image's Dockerfiles: inside the dataset's directory, and there."""
        SWEInstance.from_dict(instance)
        ImageSpec.from_instance(instance, self.dataset_dir)

    async def init(self, ctx: JobContext) -> None:
        """Read the instance; build its own image if it names one; check its repository out at base_commit in
        the job's sandbox."""
        ctx.state["task"] = SWEInstance.from_dict(ctx.instance)
        ctx.state["image_spec"] = ImageSpec.from_instance(ctx.instance, self.dataset_dir)
        await self._checkout(ctx)

    async def run(self, ctx: JobContext) -> None:
        """The agent loop on the issue; then the checkout's diff is `artifacts["patch"]` (empty if git fails)."""
        task: SWEInstance = ctx.state["task"]
        await self.loop.run(ctx, task_prompt(task))
        try:
            ctx.artifacts["patch"] = await extract_patch(ctx.sandbox, task.workdir, task.base_commit)
        except RepositoryError as exc:  # the agent broke the checkout: score an empty patch
            ctx.artifacts["patch"], ctx.artifacts["patch_error"] = "", str(exc)

    async def eval(self, ctx: JobContext) -> dict[str, Any]:
        """Apply the patch and the test patch in a fresh sandbox; reward 1.0 when all the instance's tests pass."""
        sandbox = await self._checkout(ctx)
        timeout = float(ctx.agent_config.get("test_timeout") or DEFAULT_TEST_TIMEOUT_S)
        return await evaluate(sandbox, ctx.state["task"], str(ctx.artifacts.get("patch") or ""), timeout)

    async def _checkout(self, ctx: JobContext) -> Sandbox:
        """A sandbox (of the instance's image, if it has one) with the repository checked out at base_commit."""
        task: SWEInstance = ctx.state["task"]
        root = repo_dir(self.repos_dir, task.repo)
        spec: ImageSpec | None = ctx.state["image_spec"]
        sandbox = await ctx.start_sandbox(
            None if spec is None else SandboxSpec(image=str(await self._image(ctx, spec)))
        )
        await materialize(sandbox, root, task.workdir, task.base_commit)
        return sandbox

    async def _image(self, ctx: JobContext, spec: ImageSpec) -> Path:
        """The instance image's root directory, built (or found) and leased until the stage's release."""
        images = self.images()
        image, lease = await images.acquire(spec)
        ctx.on_release(lease.release)
        builder = images.builder
        root = await asyncio.to_thread(unpack_sif, image.path, builder.cache_dir, str(builder.binary))
        ctx.artifacts.setdefault(
            "image", {"cached": image.cached, "base_cached": image.base_cached, "seconds": round(image.seconds, 3)}
        )
        return root
