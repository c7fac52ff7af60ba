"""`prorl-server profile-backend URL`: measure a live OpenAI-compatible backend's interference profile.

Per-token time by batch size: for each batch size b, b completions are sent at once, each with its own random
token-id prompt (so no prefix cache helps) and `ignore_eos`, once with `--short-tokens` and once with
`--long-tokens` output tokens; the batch's wall time (first send to last answer) is taken at each length and
the per-token time is their difference over the difference in tokens, which cancels the prefill and the
per-request overhead. Prefill cost per token: single requests with one output token and prompts of
`--prefill-tokens` short and long, the same way. Each figure is the median of `--repeats` runs. The result
is a profile file (`scheduling/profile_file.py`) for `--interference-profile`, `--backend-profile` and
`sim-llm --profile`.

The backend is untrusted: answers are read up to `MAX_ANSWER_BYTES`, must be JSON completions that generated
exactly the tokens asked for (else the measurement would be wrong, and it stops with an error), and every
request has a timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from prorl_server.errors import LaunchError
from prorl_server.scheduling import FORMAT, ProfileFile

MAX_ANSWER_BYTES = 4 * 1024 * 1024


class ProfilingError(LaunchError, RuntimeError):
    """The backend could not be measured (unreachable, refused, or answered other than asked)."""


@dataclass(frozen=True)
class ProfilerSettings:
    """What to measure and how long (defaults: about a minute against a small model on 2 CPU cores)."""

    url: str
    model: str | None = None
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    prompt_tokens: int = 32
    short_tokens: int = 8
    long_tokens: int = 40
    prefill_tokens: tuple[int, int] = (64, 512)
    repeats: int = 2
    token_ids: tuple[int, int] = (1000, 10000)  # prompt ids drawn from [low, high): inside most vocabularies
    model_parallel: int = 1
    timeout_s: float = 300.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.batch_sizes or any(b < 1 or b > 4096 for b in self.batch_sizes):
            raise ValueError(f"batch sizes must be between 1 and 4096, got {self.batch_sizes}")
        if len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise ValueError(f"batch sizes must be distinct, got {self.batch_sizes}")
        if not 1 <= self.short_tokens < self.long_tokens <= 100_000:
            raise ValueError("need 1 <= --short-tokens < --long-tokens <= 100000")
        if not 1 <= self.prefill_tokens[0] < self.prefill_tokens[1] <= 1_000_000:
            raise ValueError("need 1 <= short < long prefill tokens <= 1000000")
        if not 1 <= self.prompt_tokens <= 1_000_000 or not 1 <= self.repeats <= 100:
            raise ValueError("--prompt-tokens must be >= 1 and --repeats between 1 and 100")
        if not 0 <= self.token_ids[0] < self.token_ids[1]:
            raise ValueError(f"token id range must be 0 <= low < high, got {self.token_ids}")


def base_url(url: str) -> str:
    """`http://host:port` from an address with or without `/v1`."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


class BackendProfiler:
    """Sends the timed requests of one profiling run (module docstring)."""

    def __init__(self, settings: ProfilerSettings, client: httpx.AsyncClient) -> None:
        self.settings = settings
        self.client = client
        self.base = base_url(settings.url)
        self.rng = random.Random(settings.seed)
        self.model = settings.model or ""

    async def _get_json(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            async with self.client.stream(method, f"{self.base}{path}", json=body) as answer:
                data = bytearray()
                async for chunk in answer.aiter_bytes():
                    data += chunk
                    if len(data) > MAX_ANSWER_BYTES:
                        raise ProfilingError(f"{path}: answer larger than {MAX_ANSWER_BYTES} bytes")
                if answer.status_code != 200:
                    raise ProfilingError(f"{path}: HTTP {answer.status_code}: {data[:300].decode(errors='replace')}")
        except httpx.HTTPError as exc:
            raise ProfilingError(f"{path}: {type(exc).__name__}: {exc}") from None
        try:
            return json.loads(data)
        except ValueError:
            raise ProfilingError(f"{path}: the answer is not JSON") from None

    async def resolve_model(self) -> str:
        """`--model`, else the first id of `GET /v1/models`."""
        if not self.model:
            models = await self._get_json("GET", "/v1/models")
            try:
                self.model = str(models["data"][0]["id"])[:4096]
            except (KeyError, IndexError, TypeError):
                raise ProfilingError("/v1/models lists no model; pass --model") from None
        return self.model

    def _prompt(self, length: int) -> list[int]:
        low, high = self.settings.token_ids
        return [self.rng.randrange(low, high) for _ in range(length)]

    async def _complete(self, prompt_len: int, max_tokens: int) -> None:
        body = {
            "model": self.model,
            "prompt": self._prompt(prompt_len),
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
        }
        answer = await self._get_json("POST", "/v1/completions", body)
        try:
            generated = int(answer["usage"]["completion_tokens"])
        except (KeyError, TypeError, ValueError):
            raise ProfilingError("a completion came back without usage.completion_tokens") from None
        if generated != max_tokens:
            raise ProfilingError(
                f"asked for {max_tokens} tokens with ignore_eos, got {generated}: the backend does not honour "
                "ignore_eos or max_tokens, so its timing cannot be measured this way"
            )

    async def batch_seconds(self, batch: int, prompt_len: int, max_tokens: int) -> float:
        """Wall seconds for `batch` completions sent at once, from the first send to the last answer."""
        started = time.perf_counter()
        await asyncio.gather(*(self._complete(prompt_len, max_tokens) for _ in range(batch)))
        return time.perf_counter() - started

    async def _median(self, batch: int, prompt_len: int, max_tokens: int) -> float:
        return statistics.median(
            [await self.batch_seconds(batch, prompt_len, max_tokens) for _ in range(self.settings.repeats)]
        )

    async def per_token_seconds(self, batch: int) -> float:
        """Seconds per generated token with `batch` requests running together."""
        s = self.settings
        short = await self._median(batch, s.prompt_tokens, s.short_tokens)
        long = await self._median(batch, s.prompt_tokens, s.long_tokens)
        seconds = (long - short) / (s.long_tokens - s.short_tokens)
        if seconds <= 0:
            raise ProfilingError(
                f"batch {batch}: {s.long_tokens} tokens took no longer than {s.short_tokens} ({long:.4f} s vs "
                f"{short:.4f} s): too noisy; raise --long-tokens or --repeats"
            )
        return seconds

    async def prefill_seconds_per_token(self) -> float:
        """Seconds per prompt token (uncached), at least 0 (a difference below the noise reads as 0)."""
        short_len, long_len = self.settings.prefill_tokens
        short = await self._median(1, short_len, 1)
        long = await self._median(1, long_len, 1)
        return max(0.0, (long - short) / (long_len - short_len))


async def measure(settings: ProfilerSettings, progress: Any = None) -> ProfileFile:
    """Measure the backend at `settings.url` (module docstring); `progress(line)` hears each figure."""
    say = progress or (lambda line: None)
    async with httpx.AsyncClient(timeout=settings.timeout_s, trust_env=False) as client:
        profiler = BackendProfiler(settings, client)
        model = await profiler.resolve_model()
        await profiler.batch_seconds(1, settings.prompt_tokens, settings.short_tokens)  # warm-up, not counted
        points = []
        for batch in sorted(settings.batch_sizes):
            seconds = await profiler.per_token_seconds(batch)
            say(f"batch {batch}: {seconds * 1000:.2f} ms per token")
            points.append((batch, seconds))
        prefill = await profiler.prefill_seconds_per_token()
        say(f"prefill: {prefill * 1e6:.1f} us per prompt token")
    s = settings
    method = (
        f"profile-backend: batches of {list(s.batch_sizes)} random {s.prompt_tokens}-token prompts, "
        f"{s.short_tokens} vs {s.long_tokens} output tokens (ignore_eos), median of {s.repeats}; prefill from "
        f"{s.prefill_tokens[0]} vs {s.prefill_tokens[1]} prompt tokens"
    )
    return ProfileFile(
        format=FORMAT,
        points=tuple(points),
        prefill_s_per_token=prefill,
        model_parallel=s.model_parallel,
        backend=s.url[:4096],
        model=model,
        measured_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        method=method,
    )


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(item) for item in text.split(",") if item.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `profile-backend` flags."""
    d = ProfilerSettings(url="")
    parser.add_argument("url", help="the backend, http://host:port or http://host:port/v1")
    parser.add_argument("--out", type=Path, required=True, help="write the profile file here (JSON)")
    parser.add_argument("--model", default=None, help="model id to ask for (default: the first of /v1/models)")
    parser.add_argument("--batch-sizes", type=_ints, default=d.batch_sizes, help="batch sizes to time, comma-separated")
    parser.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens, help="prompt length of the timed runs")
    parser.add_argument("--short-tokens", type=int, default=d.short_tokens, help="output tokens of the short run")
    parser.add_argument("--long-tokens", type=int, default=d.long_tokens, help="output tokens of the long run")
    parser.add_argument(
        "--prefill-tokens", type=_ints, default=d.prefill_tokens, help="short,long prompt lengths for the prefill"
    )
    parser.add_argument("--repeats", type=int, default=d.repeats, help="runs per figure (the median counts)")
    parser.add_argument(
        "--token-ids", type=_ints, default=d.token_ids, help="low,high: prompt token ids drawn from [low, high)"
    )
    parser.add_argument(
        "--model-parallel", type=int, default=d.model_parallel, help="the backend's model-parallel degree (recorded)"
    )
    parser.add_argument("--timeout", type=float, default=d.timeout_s, help="seconds per request at most")
    parser.add_argument("--seed", type=int, default=d.seed, help="seeds the random prompts")


def run_from_args(args: argparse.Namespace) -> None:
    """Measure and write the profile file; problems end the process with a message (exit code 1)."""
    try:
        if len(args.prefill_tokens) != 2 or len(args.token_ids) != 2:
            raise ValueError("--prefill-tokens and --token-ids take two integers each")
        settings = ProfilerSettings(
            url=args.url,
            model=args.model,
            batch_sizes=args.batch_sizes,
            prompt_tokens=args.prompt_tokens,
            short_tokens=args.short_tokens,
            long_tokens=args.long_tokens,
            prefill_tokens=(args.prefill_tokens[0], args.prefill_tokens[1]),
            repeats=args.repeats,
            token_ids=(args.token_ids[0], args.token_ids[1]),
            model_parallel=args.model_parallel,
            timeout_s=args.timeout,
            seed=args.seed,
        )
        result = asyncio.run(measure(settings, progress=lambda line: print(line, flush=True)))
    except (ValueError, ProfilingError) as exc:
        sys.exit(f"prorl-server profile-backend: {exc}")
    args.out.write_text(result.model_dump_json(indent=2) + "\n")
    print(f"wrote {args.out}: {result.points_text()}, prefill {result.prefill_s_per_token:.3g} s/token")
