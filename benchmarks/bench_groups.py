"""Benchmark: what GRPO groups waste per training step (INIT seconds, sandbox-seconds, decoded tokens), today
against refilling failed members, keeping in-flight work across weight updates and initialising once per group
(forking the members), on the simulator; and the INIT of one group on real sandboxes, today against forking.

Run it from the repository root::

    .venv/bin/python benchmarks/bench_groups.py [--json out.json] [--arms today-abort,refill,keep]
        [--steps 3] [--groups 16] [--group-size 8] [--failure-rate 0.05] [--seed 0] [--time-scale 20]
        [--sandbox-group-size 8] [--sandbox-packages 16] [--no-sandbox-part]

About three and a half minutes on 2 cores with the defaults (the sandbox part about 30 s). Each arm (a row of the tables) gets a fresh prorl-server (in
this process) over a fresh simulator (SimLLMServer: `--max-num-seqs` 128, the default latency profile, output
lengths lognormal around 256 tokens, `--time-scale` simulated seconds per wall second), and runs `--steps`
training steps. A step posts `--groups` groups of `--group-size` members at once (`POST /groups?wait=false`)
and waits for all of them; `--update-after` seconds (simulated) into the step the trainer updates the weights
once (pause in the arm's mode, update to the next version after `--update-hold` simulated seconds, resume),
as an RL trainer does between two steps while the next step's rollouts already run.

A member (the handler below, `GroupBenchHandler`) spends `--init-s` simulated seconds in INIT (a SWE-like
repository checkout and dependency install), then samples `--turns` turns. Its INIT fails with a
SandboxError (an infrastructure failure, as when a sandbox cannot start) with probability `--failure-rate`,
drawn from its job id and `--seed`, so every arm sees the same failures; a refill is a new job id and draws
again. Times below are simulated seconds (wall seconds x `--time-scale`).

Arms (`ARMS`, a registry: a new arm is one `Arm` entry naming its server settings, the update's pause mode
and the factory of its member handler, `GroupBenchHandler.from_args` unless it brings its own):

- `today-abort`: no refill (`group_refill_attempts` 0), the update aborts the calls in flight (resent after);
- `today-wait`: no refill, the update waits for the calls in flight (nothing discarded, the trainer waits);
- `refill`: failed members refilled (the server's defaults), update mode abort;
- `keep`: no refill, update mode keep (the simulator freezes the calls in flight, resumed after the update);
- `refill+keep`: both;
- `fork`: no refill, update mode abort, the member handler has `fork_after_init` (`ForkingGroupBenchHandler`):
  the group's first member runs INIT and the others start from a copy of what it left (its simulated INIT
  starts no sandbox, so here a fork costs nothing; the sandbox part below measures what one costs). A
  member that did not run INIT draws its infrastructure failure when its RUN starts (a fork that could not
  start), so every arm fails the same members;
- `all`: fork, refill and keep together.

Figures per arm, per step (means over the steps):

- `init_s`: INIT seconds the handler's INIT ran, summed over every member launched (failed ones and refills
  included; a forked member runs none);
- `sandbox_s`: sandbox-seconds, those INIT seconds plus the RUN and EVAL seconds of every member launched
  (each holds its sandbox from its INIT, or its fork, to the end of EVAL);
- `groups_lost`: groups that ended with fewer than `--group-size` usable members (a GRPO trainer drops them);
- `tokens_discarded`: tokens the engine decoded that no member's trajectory carries (calls aborted by the
  update), and `tokens_in_lost_groups`: model tokens of the members of lost groups; `tokens_wasted` is both;
- `in_flight_tokens`: tokens the calls in flight had decoded when the update paused them (the engine's count
  just before the pause), and `discarded_pct` = tokens_discarded / in_flight_tokens. With abort it can pass
  100%: the simulator goes on decoding an aborted call until the closed connection reaches it, and the wall
  time that takes (server, simulator and client share this process) counts `--time-scale` times over;
- `update_wait_s`: how long the pause took to answer (the trainer waits for it before it can update).

The sandbox part (`fork_init.py`, skipped with `--no-sandbox-part`) runs one group of `--sandbox-group-size`
members whose INIT checks a repository out and installs `--sandbox-packages` wheels with pip, in real
bubblewrap sandboxes, each member running its own INIT (`today`) and forking one INIT (`fork`), next
to one member's INIT alone; fork_init.py's docstring defines its figures (the group's INIT wall seconds and
their ratio to the one member's, INITs run, INIT and sandbox-seconds). It needs a runtime that forks
(bubblewrap forks under a server running as root); elsewhere it ends with the reason (exit code 1:
a part could not run), so pass `--no-sandbox-part` there.

Targets (issue 25): a 5% infrastructure failure rate costs <= 5% of groups with refills (today about a
third: 1 - 0.95^8); tokens discarded per weight update <= 1% of in-flight tokens with keep; the INIT of a
group of 8 <= 1.5x one member's with fork. The exit code is 0 whatever the figures.

JSON output (`--json PATH`)::

    {
      "machine": {"cpus", "python", "load_avg_1m_at_start"},
      "config": {every command-line option},
      "arms": {ARM: {"description", "steps": [{"init_s", "sandbox_s", "groups", "groups_lost",
                 "members_launched", "refills", "tokens_decoded", "tokens_discarded", "tokens_in_lost_groups",
                 "tokens_wasted", "in_flight_tokens", "discarded_pct", "update_wait_s", "step_s"}],
                 "mean": {the same keys, averaged over the steps}}},
      "sandbox_init": {"runtime", "group_size", "one_member_init_s", "arms": {"today"|"fork": {"group_init_s",
                       "ratio", "inits", "init_work_s", "init_stage_s", "sandbox_s"}}},
      "checks": [{"metric", "value", "baseline", "target", "pass"}],
      "elapsed_s": float
    }
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import check, finish, positive_int, print_checks, report_header
from fork_init import run_init_part

from prorl_server.api.app import create_app
from prorl_server.api.state import ServerState
from prorl_server.config import ServerSettings
from prorl_server.handlers import AgentHandler, HandlerRegistry, JobContext
from prorl_server.sandbox.errors import SandboxError
from prorl_server.simllm import SimLLMServer
from prorl_server.testing.uvicorn_thread import UvicornThread

DATA_SOURCE = "bench_groups"
STEP_KEYS = (
    "init_s",
    "sandbox_s",
    "groups",
    "groups_lost",
    "members_launched",
    "refills",
    "tokens_decoded",
    "tokens_discarded",
    "tokens_in_lost_groups",
    "tokens_wasted",
    "in_flight_tokens",
    "discarded_pct",
    "update_wait_s",
    "step_s",
)


class GroupBenchHandler(AgentHandler):
    """A member: a simulated INIT that fails at `failure_rate` (seeded by job id), then `turns` LLM turns."""

    name = DATA_SOURCE

    def __init__(self, *, init_s: float, failure_rate: float, seed: int, turns: int, time_scale: float) -> None:
        self.init_s = init_s
        self.failure_rate = failure_rate
        self.seed = seed
        self.turns = turns
        self.time_scale = time_scale
        self.init_work_s = 0.0  # wall seconds its INITs ran, in all
        self._lock = threading.Lock()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> GroupBenchHandler:
        """The handler the command line describes."""
        return cls(
            init_s=args.init_s,
            failure_rate=args.failure_rate,
            seed=args.seed,
            turns=args.turns,
            time_scale=args.time_scale,
        )

    def fails(self, job_id: str) -> bool:
        """Whether this job's INIT fails: a draw from its id and the seed, the same in every arm."""
        digest = hashlib.sha256(f"{self.seed}:{job_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.failure_rate

    async def init(self, ctx: JobContext) -> None:
        started = time.monotonic()
        try:
            await asyncio.sleep(self.init_s / self.time_scale)
        finally:
            with self._lock:
                self.init_work_s += time.monotonic() - started
        ctx.state["initialised_by"] = ctx.job_id
        if self.fails(ctx.job_id):
            raise SandboxError("simulated infrastructure failure: the member's sandbox could not start")

    async def run(self, ctx: JobContext) -> None:
        await ctx.llm.start([{"role": "user", "content": f"Fix the failing test of {ctx.instance['repo']}."}])
        for turn in range(self.turns):
            await ctx.llm.generate()
            if turn + 1 < self.turns:
                await ctx.llm.add_messages([{"role": "user", "content": f"test output {turn}"}])

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


class ForkingGroupBenchHandler(GroupBenchHandler):
    """The same member with `fork_after_init`: INIT once per group; a member that did not run it draws its
    failure as its RUN starts (its fork could not start), a SandboxError as the failed INIT's."""

    fork_after_init = True

    async def run(self, ctx: JobContext) -> None:
        if ctx.state.get("initialised_by") != ctx.job_id and self.fails(ctx.job_id):
            raise SandboxError("simulated infrastructure failure: the member's fork could not start")
        await super().run(ctx)


@dataclass(frozen=True)
class Arm:
    """One configuration (a row): server settings on top of the defaults, the update's pause mode, and the
    factory of the member handler (registered under DATA_SOURCE)."""

    name: str
    description: str
    settings: dict[str, Any] = field(default_factory=dict)
    pause_mode: str = "abort"
    handler: Callable[[argparse.Namespace], GroupBenchHandler] = GroupBenchHandler.from_args


NO_REFILL = {"group_refill_attempts": 0}
ARMS: dict[str, Arm] = {
    arm.name: arm
    for arm in (
        Arm("today-abort", "no refill; update aborts calls in flight", NO_REFILL, "abort"),
        Arm("today-wait", "no refill; update waits for calls in flight", NO_REFILL, "wait"),
        Arm("refill", "failed members refilled; update aborts", {}, "abort"),
        Arm("keep", "no refill; update keeps calls in flight", NO_REFILL, "keep"),
        Arm("refill+keep", "failed members refilled; update keeps", {}, "keep"),
        Arm(
            "fork",
            "INIT once per group, members fork; no refill; update aborts",
            NO_REFILL,
            "abort",
            ForkingGroupBenchHandler.from_args,
        ),
        Arm("all", "fork, refill and keep together", {}, "keep", ForkingGroupBenchHandler.from_args),
    )
}


class Bench:
    """One arm's server, simulator and HTTP client."""

    def __init__(self, arm: Arm, args: argparse.Namespace) -> None:
        self.arm = arm
        self.args = args
        self.sim = SimLLMServer(time_scale=args.time_scale, max_num_seqs=args.max_num_seqs, seed=args.seed)
        self.handler = arm.handler(args)
        self.registry = HandlerRegistry()
        self.registry.register(DATA_SOURCE, self.handler)
        self.server: UvicornThread | None = None
        self.version = 1

    def __enter__(self) -> Bench:
        self.sim.start()
        settings = ServerSettings(
            llm_servers=[],
            run_workers=self.args.groups * self.args.group_size * 2,
            init_workers=self.args.groups * self.args.group_size * 2,
            eval_workers=64,
            **self.arm.settings,
        )
        state = ServerState.build(settings, registry=self.registry)
        self.server = UvicornThread(create_app(state=state)).start()
        httpx.post(
            f"{self.server.url}/add_llm_server",
            json={"address": self.sim.address, "weight_version": self.version},
            timeout=30,
            trust_env=False,
        ).raise_for_status()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.stop()
        self.sim.stop()

    async def step(self, http: httpx.AsyncClient, index: int) -> dict[str, float]:
        """One training step: every group posted at once, one weight update in the middle."""
        args, engine = self.args, self.sim.engine
        scale = args.time_scale
        decoded_before = engine.stats.generation_tokens
        init_before = self.handler.init_work_s
        started = time.monotonic()
        ids = [f"s{index}-g{g}" for g in range(args.groups)]
        for group_id in ids:
            body = {
                "instance": {"data_source": DATA_SOURCE, "repo": group_id},
                "n": args.group_size,
                "sampling_params": {"max_tokens": args.max_tokens},
            }
            answer = await http.post("/groups?wait=false", json={**body, "group_id": group_id})
            answer.raise_for_status()
        update = asyncio.create_task(self.update(http, args.update_after_s / scale))
        groups = await asyncio.gather(*(self.wait_group(http, group_id) for group_id in ids))
        in_flight, wait_s = await update
        step_s = (time.monotonic() - started) * scale
        members = [m for g in groups for m in g["members"]]
        results = await asyncio.gather(*(self.result(http, m["job_id"]) for m in members))
        by_job = {r["job_id"]: r for r in results}
        lost = [g for g in groups if g["usable"] < args.group_size]
        carried = sum(model_tokens(r) for r in results)
        in_lost = sum(model_tokens(by_job[m["job_id"]]) for g in lost for m in g["members"])
        decoded = engine.stats.generation_tokens - decoded_before
        discarded = max(0, decoded - carried)
        init_s = (self.handler.init_work_s - init_before) * scale
        return {
            "init_s": init_s,
            "sandbox_s": init_s + sum(r["timing"]["run_s"] + r["timing"]["eval_s"] for r in results) * scale,
            "groups": len(groups),
            "groups_lost": len(lost),
            "members_launched": len(members),
            "refills": sum(len(g["refills"]) for g in groups),
            "tokens_decoded": decoded,
            "tokens_discarded": discarded,
            "tokens_in_lost_groups": in_lost,
            "tokens_wasted": discarded + in_lost,
            "in_flight_tokens": in_flight,
            "discarded_pct": 100 * discarded / in_flight if in_flight else 0.0,
            "update_wait_s": wait_s * scale,
            "step_s": step_s,
        }

    async def update(self, http: httpx.AsyncClient, after_s: float) -> tuple[int, float]:
        """Pause (the arm's mode), hold, update to the next version, resume; (in-flight tokens, pause wait)."""
        await asyncio.sleep(after_s)
        in_flight = self.sim.engine.decoded_in_flight
        started = time.monotonic()
        (await http.post("/weights/pause", json={"mode": self.arm.pause_mode})).raise_for_status()
        wait_s = time.monotonic() - started
        await asyncio.sleep(self.args.update_hold_s / self.args.time_scale)
        self.version += 1
        (await http.post("/weights/update", json={"version": self.version})).raise_for_status()
        (await http.post("/weights/resume")).raise_for_status()
        return in_flight, wait_s

    @staticmethod
    async def wait_group(http: httpx.AsyncClient, group_id: str) -> dict[str, Any]:
        while True:
            group = (await http.get(f"/groups/{group_id}", params={"wait": 30})).raise_for_status().json()
            if group["status"] not in ("pending", "running"):
                return group

    @staticmethod
    async def result(http: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
        return (await http.get(f"/jobs/{job_id}")).raise_for_status().json()["result"]


def model_tokens(result: dict[str, Any]) -> int:
    """Model tokens of a result's trajectory (0 without one)."""
    trajectory = result.get("trajectory") or {}
    return sum(trajectory.get("response_mask") or [])


async def run_arm(arm: Arm, args: argparse.Namespace) -> dict[str, Any]:
    with Bench(arm, args) as bench:
        assert bench.server is not None
        async with httpx.AsyncClient(base_url=bench.server.url, timeout=120, trust_env=False) as http:
            steps = [await bench.step(http, i) for i in range(args.steps)]
    mean = {k: sum(s[k] for s in steps) / len(steps) for k in STEP_KEYS}
    return {"description": arm.description, "steps": steps, "mean": mean}


def print_table(arms: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\nPer step (mean of {args.steps}): {args.groups} groups of {args.group_size}, "
        f"{100 * args.failure_rate:g}% INIT failures, one weight update; simulated seconds"
    )
    columns = (
        ("arm", None),
        ("INIT s", "init_s"),
        ("sandbox s", "sandbox_s"),
        ("groups lost", "groups_lost"),
        ("refills", "refills"),
        ("tok decoded", "tokens_decoded"),
        ("tok discarded", "tokens_discarded"),
        ("tok in lost groups", "tokens_in_lost_groups"),
        ("tok wasted", "tokens_wasted"),
        ("in-flight tok", "in_flight_tokens"),
        ("discarded %", "discarded_pct"),
        ("update wait s", "update_wait_s"),
    )
    rows = [[name] + [f"{data['mean'][key]:,.1f}" for _, key in columns[1:]] for name, data in arms.items()]
    widths = [max(len(str(c)) for c in col) for col in zip([c for c, _ in columns], *rows, strict=True)]
    print("  " + "  ".join(title.rjust(w) for (title, _), w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  " + "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))


def print_sandbox_part(part: dict[str, Any]) -> None:
    print(
        f"\nINIT of one group of {part['group_size']} on {part['runtime']} sandboxes (wall seconds); one member's "
        f"INIT alone: {part['one_member_init_s']:.2f} s"
    )
    columns = (
        ("arm", None),
        ("group INIT s", "group_init_s"),
        ("x one member", "ratio"),
        ("INITs run", "inits"),
        ("INIT work s", "init_work_s"),
        ("INIT stage s", "init_stage_s"),
        ("sandbox s", "sandbox_s"),
    )
    rows = [[name] + [f"{data[key]:,.2f}" for _, key in columns[1:]] for name, data in part["arms"].items()]
    widths = [max(len(str(c)) for c in col) for col in zip([c for c, _ in columns], *rows, strict=True)]
    print("  " + "  ".join(title.rjust(w) for (title, _), w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  " + "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))


def checks(arms: dict[str, dict[str, Any]], part: dict[str, Any] | None) -> list[dict[str, Any]]:
    rows = []
    today = arms.get("today-abort")
    if today is not None:
        baseline = f"today-abort {100 * today['mean']['groups_lost'] / today['mean']['groups']:.1f}%"
    else:
        baseline = "today-abort not run"
    for name in ("refill", "refill+keep"):
        if name in arms:
            mean = arms[name]["mean"]
            pct = 100 * mean["groups_lost"] / mean["groups"]
            rows.append(check(f"groups lost, {name}", f"{pct:.1f}%", baseline, "<= 5%", pct <= 5))
    abort_pct = f"today-abort {today['mean']['discarded_pct']:.1f}%" if today is not None else "today-abort not run"
    for name in ("keep", "refill+keep"):
        if name in arms:
            pct = arms[name]["mean"]["discarded_pct"]
            rows.append(check(f"tokens discarded per update, {name}", f"{pct:.2f}%", abort_pct, "<= 1%", pct <= 1))
    init_today = f"today-abort {today['mean']['init_s']:,.0f} s" if today is not None else "today-abort not run"
    for name in ("fork", "all"):
        if name in arms:
            rows.append(
                check(f"INIT s per step, {name}", f"{arms[name]['mean']['init_s']:,.0f} s", init_today, "-", None)
            )
    if part is not None:
        today_part, fork = part["arms"]["today"], part["arms"]["fork"]
        baseline = f"one member {part['one_member_init_s']:.2f} s; today {today_part['ratio']:.2f}x"
        size = part["group_size"]
        rows.append(
            check(
                f"INIT of a group of {size}, fork", f"{fork['ratio']:.2f}x", baseline, "<= 1.5x", fork["ratio"] <= 1.5
            )
        )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of: {', '.join(ARMS)}")
    parser.add_argument("--steps", type=positive_int, default=3)
    parser.add_argument("--groups", type=positive_int, default=16, help="groups per step")
    parser.add_argument("--group-size", type=positive_int, default=8)
    parser.add_argument("--failure-rate", type=float, default=0.05, help="chance a member's INIT fails")
    parser.add_argument("--init-s", type=float, default=20.0, help="simulated seconds of a member's INIT")
    parser.add_argument("--turns", type=positive_int, default=2, help="LLM turns per member")
    parser.add_argument(
        "--max-tokens", type=positive_int, default=1024, help="per turn (lengths lognormal, median 256)"
    )
    parser.add_argument("--update-after-s", type=float, default=30.0, help="simulated seconds into the step")
    parser.add_argument("--update-hold-s", type=float, default=5.0, help="simulated seconds the update takes")
    parser.add_argument("--max-num-seqs", type=positive_int, default=128)
    parser.add_argument("--time-scale", type=float, default=20.0, help="simulated seconds per wall second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sandbox-group-size", type=positive_int, default=8, help="members of its group")
    parser.add_argument("--sandbox-packages", type=positive_int, default=16, help="wheels its INIT installs")
    parser.add_argument("--sandbox-modules", type=positive_int, default=40, help="modules per wheel")
    parser.add_argument("--sandbox-files", type=positive_int, default=300, help="files of its repository")
    parser.add_argument("--no-sandbox-part", action="store_true", help="skip the sandbox part")
    args = parser.parse_args(argv)
    unknown = [a for a in args.arms.split(",") if a not in ARMS]
    if unknown:
        parser.error(f"unknown arm(s) {unknown}; known: {', '.join(ARMS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.getLogger("prorl_server.pipeline.outcome").setLevel(logging.ERROR)  # each injected failure
    started = time.monotonic()
    report = report_header(args)
    arms: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    for name in args.arms.split(","):
        print(f"arm {name}: {ARMS[name].description} ...", flush=True)
        try:
            arms[name] = asyncio.run(run_arm(ARMS[name], args))
        except (httpx.HTTPError, OSError, RuntimeError) as exc:
            failures[name] = f"{type(exc).__name__}: {exc}"
    part = None
    if not args.no_sandbox_part:
        print(f"sandbox part: INIT of a group of {args.sandbox_group_size}, today and forked ...", flush=True)
        try:
            part = run_init_part(
                args.sandbox_group_size,
                args.sandbox_files,
                args.sandbox_packages,
                args.sandbox_modules,
            )
        except (httpx.HTTPError, OSError, RuntimeError) as exc:
            failures["sandbox part"] = f"{type(exc).__name__}: {exc}"
    print_table(arms, args)
    if part is not None:
        print_sandbox_part(part)
    rows = checks(arms, part)
    print_checks(rows)
    report.update(arms=arms, sandbox_init=part, checks=rows, elapsed_s=time.monotonic() - started)
    return finish(report, failures, args.json, None)


if __name__ == "__main__":
    raise SystemExit(main())
