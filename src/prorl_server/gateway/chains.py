"""Chain matching: which chain of a session a call belongs to, and how it joins it.

A session's calls form chains: a main agent, its sub-agents, parallel tool chains, side calls. Each chain
has segments (token streams, `LLMSession`s); its last segment has a tip, the messages (as digests) a call
must start with to continue it. `place` decides, for one call:

- CONTINUE: the call's messages extend a chain's tip (its last call's messages, the reply, new messages;
  same tools); with several such chains, the one whose tip is longest;
- RETRY: the call's messages are exactly a tip whose turn was not sampled (the call before failed);
- ROLLBACK: the call's messages are those an earlier turn of a tip's segment was sampled from (the last
  assistant turn, or more, dropped): a new segment of that chain starts from the very ids of that prompt;
- REWRITE: it extends no tip but has a chain's head, the leading system messages and the first message
  after them (a compaction that keeps the task, an edited reply, other tools): a new segment of that chain
  (of the chain sharing the longest prefix with the call, the latest used on a tie);
- NEW: it shares nothing: a new chain.

Calls are matched only against chains of the same model pool: the session's own model, or one side-call
model name. Messages are compared by digest, so a tip holds 16 bytes a message.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from prorl_server.gateway.messages import MessageKey
from prorl_server.gateway.protocol import ChatMessage, SystemMessage
from prorl_server.llm import LLMSession

Digest = bytes


def digest(key: MessageKey) -> Digest:
    """A message key's digest (what tips and heads hold)."""
    return hashlib.blake2b(key.encode(), digest_size=16).digest()


def head_of(messages: Sequence[ChatMessage], keys: Sequence[Digest]) -> tuple[Digest, ...]:
    """A conversation's identity: its leading system (or developer) messages and the first message after."""
    system = 0
    while system < len(messages) and isinstance(messages[system], SystemMessage):
        system += 1
    return tuple(keys[: system + 1])


@dataclass
class Chain:
    """One chain: its segments in order, and the tip of the last one."""

    id: int
    model: str  # the model name its first call sent
    side_call: bool  # under another model name than the session's
    head: tuple[Digest, ...]
    segments: list[LLMSession] = field(default_factory=list)
    keys: list[Digest] = field(default_factory=list)  # the tip: its last call's messages (and reply, once sampled)
    tools: Digest = b""
    sampled: bool = False  # whether the tip's last call was answered
    turn_starts: list[tuple[int, int]] = field(default_factory=list)  # the last segment's turns: (messages, prompt_len)
    calls: int = 0
    rewrites: int = 0
    last_used: int = 0  # the session's call count when it was last placed

    @property
    def pool(self) -> str | None:
        """The model pool it is matched in: None for the session's own model, else the side call's name."""
        return self.model if self.side_call else None

    def common_prefix(self, keys: Sequence[Digest]) -> int:
        """How many leading messages `keys` shares with the tip."""
        n = 0
        for mine, theirs in zip(self.keys, keys, strict=False):
            if mine != theirs:
                break
            n += 1
        return n


class Move(enum.Enum):
    CONTINUE = "continue"
    RETRY = "retry"
    ROLLBACK = "rollback"
    REWRITE = "rewrite"
    NEW = "new"


@dataclass(frozen=True)
class Placement:
    """Where a call goes: `chain` (None for NEW) and, for ROLLBACK, the prompt length to start from."""

    move: Move
    chain: Chain | None = None
    prompt_len: int = 0


def place(
    chains: Sequence[Chain], pool: str | None, keys: Sequence[Digest], head: tuple[Digest, ...], tools: Digest
) -> Placement:
    """How a call with messages `keys` (and `head`, `tools`) in model `pool` joins `chains`."""
    mine = [c for c in chains if c.pool == pool]
    best: Chain | None = None
    for chain in mine:
        if chain.tools != tools or not _extends(chain, keys):
            continue
        if best is None or (len(chain.keys), chain.last_used) > (len(best.keys), best.last_used):
            best = chain
    if best is not None:
        return Placement(Move.CONTINUE if best.sampled else Move.RETRY, best)
    for chain in sorted(mine, key=lambda c: c.last_used, reverse=True):
        if chain.tools != tools:
            continue
        for messages, prompt_len in chain.turn_starts:
            if messages == len(keys) and chain.keys[:messages] == list(keys):
                return Placement(Move.ROLLBACK, chain, prompt_len)
    same = [c for c in mine if c.head == head]
    if same:
        return Placement(Move.REWRITE, max(same, key=lambda c: (c.common_prefix(keys), c.last_used)))
    return Placement(Move.NEW)


def _extends(chain: Chain, keys: Sequence[Digest]) -> bool:
    """Whether `keys` continues the chain's tip: after an answered call, its messages plus at least one more;
    after a failed one, exactly its messages (a retry)."""
    n = len(chain.keys)
    if chain.sampled:
        return len(keys) > n and list(keys[:n]) == chain.keys
    return list(keys) == chain.keys
