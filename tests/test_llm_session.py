"""LLMSession rules that HTTP tests do not reach easily."""

from __future__ import annotations

import pytest

from prorl_server.llm import BackendPool, LLMSession, SessionFinished, VLLMClient
from prorl_server.llm.session import missing_turn_close
from prorl_server.protocol import Trajectory


def test_missing_turn_close_completes_only_what_is_missing():
    close = [2, 98]  # <|im_end|> "\n"
    assert missing_turn_close([5, 6, 2], close) == [98]
    assert missing_turn_close([5, 6], close) == [2, 98]
    assert missing_turn_close([5, 2, 98], close) == []
    assert missing_turn_close([], close) == [2, 98]


async def test_finished_session_refuses_calls_and_never_repins(backend):
    pool = BackendPool(VLLMClient())
    pool.add(backend.address)
    session = LLMSession("j", pool, Trajectory())
    await session.start([{"role": "user", "content": "hi"}])
    assert pool.backends()[0].in_flight == 1
    session.finish()
    assert pool.backends()[0].in_flight == 0
    with pytest.raises(SessionFinished):
        await session.generate()
    assert pool.backends()[0].in_flight == 0
    await pool.client.aclose_current_loop()


async def test_add_messages_needs_a_generated_turn_first(backend):
    pool = BackendPool(VLLMClient())
    pool.add(backend.address)
    session = LLMSession("j", pool, Trajectory())
    await session.start([{"role": "user", "content": "hi"}])
    with pytest.raises(RuntimeError, match="after a generated turn"):
        await session.add_messages([{"role": "user", "content": "more"}])
    session.finish()
    await pool.client.aclose_current_loop()
