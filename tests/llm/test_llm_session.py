"""LLMSession rules that HTTP tests do not reach easily: finishing, retries, failover, trial requests."""

from __future__ import annotations

import asyncio

import pytest

from prorl_server.llm import BackendPool, LLMSession, RetryPolicy, SessionFinished, VLLMClient
from prorl_server.llm.session import missing_turn_close
from prorl_server.protocol import Trajectory
from prorl_server.testing import Endpoint, Fault


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


async def test_a_failed_request_moves_the_call_and_the_pin_to_another_backend(start_backend):
    faulty, good = start_backend(), start_backend()
    pool = BackendPool(VLLMClient())
    for backend in (faulty, good):
        pool.add(backend.address)
    faulty.double.inject(Endpoint.COMPLETIONS, Fault.SERVER_ERROR)
    session = LLMSession("j", pool, Trajectory(), {"max_tokens": 8})
    await session.start([{"role": "user", "content": "hi"}])
    assert (await session.generate()).backend == good.address
    assert pool.acquire("j").backend.address == good.address  # the job stays where its call succeeded
    state = pool.backends()[0]
    assert state.breaker.consecutive_failures == 1 and state.breaker.state == "closed"
    assert pool.acquire("other").backend is state  # one failure does not take the backend out of placement
    session.finish()
    await pool.client.aclose_current_loop()


async def test_with_one_backend_a_failed_request_is_retried_there(backend):
    pool = BackendPool(VLLMClient(), retry=RetryPolicy(base_delay_s=0.01))
    pool.add(backend.address)
    backend.double.inject(Endpoint.COMPLETIONS, Fault.SERVER_ERROR)
    session = LLMSession("j", pool, Trajectory(), {"max_tokens": 8})
    await session.start([{"role": "user", "content": "hi"}])
    assert (await session.generate()).backend == backend.address
    assert len(backend.double.requests) == 2 and pool.backends()[0].breaker.consecutive_failures == 0
    session.finish()
    await pool.client.aclose_current_loop()


async def test_a_cancelled_trial_request_frees_the_trial(backend):
    pool = BackendPool(VLLMClient(), failure_threshold=1, breaker_cooldown_s=0.01)
    pool.add(backend.address)
    session = LLMSession("j", pool, Trajectory(), {"max_tokens": 8})
    await session.start([{"role": "user", "content": "hi"}])
    (state,) = pool.backends()
    pool.failed(pool.acquire("j"), "boom")
    await asyncio.sleep(0.02)
    await pool.check_health()
    assert state.breaker.state == "half_open"
    backend.double.inject(Endpoint.COMPLETIONS, Fault.HANG)
    task = asyncio.ensure_future(session.generate())
    while not backend.double.fault_log:
        await asyncio.sleep(0.01)
    assert state.breaker.trial_in_flight
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert state.breaker.state == "half_open" and state.breaker.admits_request()
    while backend.double.fault_log[0].outcome != "aborted":  # the backend saw the request closed
        await asyncio.sleep(0.01)
    session.finish()
    await pool.client.aclose_current_loop()
