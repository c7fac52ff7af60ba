"""The trajectories a trainer takes from a result's gateway sessions: the segments of a chosen chain.

A job whose agent ran through a gateway session has its recording in `artifacts["gateway"]` (one entry per
session, a `SessionResult`): chains (a main agent, its sub-agents, side calls), each a list of token-exact
segments. `chain_trajectories` picks them:

- `"reward"`: the chains the handler gave the reward to (each session's `reward_chains`; default the main);
- `"main"`: each session's main chain;
- an int: the chain with that id (the result must have one session).
"""

from __future__ import annotations

from typing import Literal

from prorl_server.protocol import JobResult, SessionResult, Trajectory

ChainChoice = Literal["reward", "main"] | int
"""Which chain of a result's sessions a trainer takes."""


def chain_trajectories(result: JobResult, chain: ChainChoice = "reward") -> list[Trajectory]:
    """The segments of the chosen chain(s) of `result`'s gateway sessions, in order; ValueError when it has
    no session recording or no such chain."""
    raw = result.artifacts.get("gateway")
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"result {result.job_id} has no gateway session recording (artifacts['gateway'])")
    sessions = [SessionResult.model_validate(entry) for entry in raw]
    if isinstance(chain, int) and len(sessions) != 1:
        raise ValueError(
            f"result {result.job_id} has {len(sessions)} gateway sessions: name a chain by 'reward' or 'main'"
        )
    picked: list[Trajectory] = []
    for session in sessions:
        if chain == "reward":
            ids = set(session.reward_chains)
        elif chain == "main":
            ids = set() if session.main_chain is None else {session.main_chain}
        else:
            ids = {chain}
        picked += [segment for c in session.chains if c.id in ids for segment in c.segments]
    if not picked:
        raise ValueError(f"result {result.job_id}: its gateway sessions have no {chain!r} chain with a sampled turn")
    return picked
