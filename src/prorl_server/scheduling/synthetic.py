"""A seeded synthetic trace of multi-turn trajectories, for the predictor's tests and benchmark.

Prompts belong to data sources of different scales (`SOURCES`: name -> median model tokens per turn). Each
prompt gets a lasting effect z ~ N(0, 0.7) on its tokens per turn and its number of turns (the prompt-specific
scale Heddle exploits), and a prompt length weakly tied to z. Each sample of a prompt gets its own effect
e ~ N(0, 0.5) (samples of one prompt diverge, Heddle figure 5): turns = 1 + an exponential draw of mean
2 * exp(0.5 z + 0.5 e), at most 16; per turn, model tokens lognormal with median scale * exp(0.8 z + 0.5 e)
and shape 0.4, and after every turn but the last an observation of about half as many tokens. Each epoch
draws `samples` trajectories of every prompt (a GRPO group).
"""

from __future__ import annotations

import math
import random

from prorl_server.scheduling.view import TrajectoryView

SOURCES = {"math": 150.0, "code": 400.0, "search": 80.0}

Trace = list[list[list[TrajectoryView]]]
"""trace[epoch][i]: trajectory i's views, before the first turn, after each turn, the last one finished."""


def synthetic_trace(seed: int, prompts: int = 96, samples: int = 8, epochs: int = 4) -> Trace:
    """`epochs` epochs of `samples` trajectories for each of `prompts` prompts, reproducible from `seed`."""
    rng = random.Random(seed)
    names = sorted(SOURCES)
    specs = []
    for p in range(prompts):
        effect = rng.gauss(0.0, 0.7)
        prompt_len = min(8192, max(32, round(math.exp(5.5 + 0.3 * effect + rng.gauss(0.0, 0.5)))))
        specs.append((names[p % len(names)], f"prompt-{p}", prompt_len, effect))
    trace: Trace = []
    for _ in range(epochs):
        epoch = []
        for source, key, prompt_len, effect in specs:
            for _ in range(samples):
                epoch.append(_trajectory(rng, source, key, prompt_len, effect))
        trace.append(epoch)
    return trace


def _trajectory(rng: random.Random, source: str, key: str, prompt_len: int, effect: float) -> list[TrajectoryView]:
    sample = rng.gauss(0.0, 0.5)
    turns = min(16, 1 + int(rng.expovariate(1.0 / (2.0 * math.exp(0.5 * effect + 0.5 * sample)))))
    median = SOURCES[source] * math.exp(0.8 * effect + 0.5 * sample)
    views = [TrajectoryView(source, key, prompt_len)]
    model = observation = 0
    for turn in range(1, turns + 1):
        model += max(1, round(median * math.exp(rng.gauss(0.0, 0.4))))
        if turn < turns:
            observation += max(1, round(0.5 * median * math.exp(rng.gauss(0.0, 0.5))))
        views.append(TrajectoryView(source, key, prompt_len, turn, model, observation, finished=turn == turns))
    return views
