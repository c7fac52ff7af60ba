"""Wire models of the trainer's session API: `POST /sessions` opens a standalone gateway session for a
harness the trainer runs itself, `DELETE /sessions/{id}` closes it and answers its token-exact recording.

The harness's own wire (OpenAI Chat Completions, Responses, Anthropic Messages) is the gateway's
(`gateway.protocol`); these are what the trainer sends and reads (docs/gateway.md).
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from prorl_server.protocol.bounded import TaskJson
from prorl_server.protocol.jobs import Trajectory

MAX_NAME_CHARS = 256
"""The longest name (a model name, an id, a data source) a session request or a harness may send."""
MAX_HARNESS_MODELS = 16

HarnessParam = Literal[
    "temperature", "top_p", "top_k", "max_tokens", "stop", "seed", "presence_penalty", "frequency_penalty"
]
"""The sampling fields of a chat completion a session may let the harness set (`harness_params`)."""
HARNESS_SAMPLING_FIELDS: tuple[str, ...] = get_args(HarnessParam)

SideCalls = Literal["record", "refuse"]
"""What a session does with calls under another model name than its own."""
RewardChains = Literal["main", "agents", "all"]
"""Which chains of a session its reward belongs to."""


class OpenSessionRequest(BaseModel):
    """`POST /sessions`: a standalone session, pinned to one backend, for a harness the trainer runs itself."""

    model_config = ConfigDict(extra="forbid")

    sampling_params: TaskJson = Field(
        default_factory=dict,
        description="Sampling params of every completion (vLLM's names); they win over the harness's, except "
        "for the fields in `harness_params`.",
    )
    harness_params: list[HarnessParam] = Field(
        default_factory=lambda: ["max_tokens"],
        description="Fields of the harness's chat request that are used, overriding `sampling_params`; the "
        "harness's other sampling fields are ignored.",
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_NAME_CHARS,
        description="A name the harness may use for the model besides the backend's served name.",
    )
    accept_any_model: bool = Field(
        default=False,
        description="Answer whatever model name the harness sends (a harness with a model name of its own, "
        "such as Claude Code's); the names it sent are in the result's `harness_models`.",
    )
    data_source: str = Field(default="", max_length=MAX_NAME_CHARS, description="For telemetry, as a job's.")
    side_calls: SideCalls = Field(
        default="record",
        description="Calls under another model name than the session's (which only `accept_any_model` lets "
        "through; titles, summaries): `record` serves them and records each name's calls as chains of their "
        "own; `refuse` answers them 404 `side_call_refused` in the dialect's error shape.",
    )
    reward_chains: RewardChains = Field(
        default="main",
        description="The chains the reward belongs to (the answer's `reward_chains`): `main`, the main chain; "
        "`agents`, every chain under the session's own model name (the main agent and its sub-agents); `all`.",
    )


class SessionOpened(BaseModel):
    """A session's address and key: give both to the harness (`OPENAI_BASE_URL`, `OPENAI_API_KEY`)."""

    session_id: str
    base_url: str = Field(description="The session's OpenAI base URL (ends in /v1).")
    api_key: str = Field(description="The session's own key; it opens this session and nothing else.")
    model: str = Field(description="The model name to send (the alias when one was given).")


class ChainRecord(BaseModel):
    """One chain of a session: the calls that continue each other (a main agent, a sub-agent, a side call),
    its segments in order, each token-exact."""

    id: int = Field(description="The chain's number in the session, in the order of their first calls.")
    model: str = Field(description="The model name its first call sent.")
    side_call: bool = Field(description="Whether its calls named another model than the session's.")
    segments: list[Trajectory] = Field(description="Its segments in order: a new one at each rewrite.")
    calls: int = Field(description="Its answered calls.")
    rewrites: int = Field(description="Its segments started after one of its calls had been answered.")
    sampled_tokens: int = Field(description="Model-sampled tokens over its segments.")


class SessionResult(BaseModel):
    """A closed session's recording: its chains, each a list of token-exact segments.

    A call joins the chain whose recorded messages it extends (the longest such); a call that extends none
    but has a chain's first messages (its system prompt and first message) starts a new segment of that chain
    (a rewrite); any other starts a new chain (docs/gateway.md, "Chains").
    """

    session_id: str
    segments: list[Trajectory] = Field(
        description="Every chain's segments, in the order they started (as before chains: the same trajectories "
        "as in `chains`)."
    )
    chains: list[ChainRecord] = Field(
        default_factory=list, description="Every chain with a sampled turn, in the order of their first calls."
    )
    main_chain: int | None = Field(
        default=None,
        description="The id of the main chain: the chain of the first call under the session's own model name "
        "(else, when every call was a side call, the chain with the most sampled tokens); null without chains.",
    )
    reward_chains: list[int] = Field(
        default_factory=list, description="The ids of the chains the reward belongs to (the session's `reward_chains`)."
    )
    rewrites: int = Field(
        description="Segments started in a chain after one of its calls had been answered: the harness rewrote "
        "that chain's history (or rolled it back)."
    )
    calls: int = Field(description="Chat completions answered.")
    side_calls: int = Field(
        default=0, description="Answered calls under another model name than the session's (in `calls` too)."
    )
    harness_models: list[str] = Field(
        default_factory=list,
        description=f"The model names the harness's answered calls sent, in order of first use (at most "
        f"{MAX_HARNESS_MODELS}).",
    )
    failed_calls: int = Field(
        description="Valid chat completions that got no reply: the backend failed, or the call was cancelled "
        "(its harness went away, or the session was closed)."
    )
