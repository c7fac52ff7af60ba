"""The one way across threads to an event loop (prorl_server.threadsafe)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from prorl_server.threadsafe import call_in_loop, run_in_loop, try_call_in_loop


def test_a_call_from_another_thread_runs_on_the_loop() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        ran: list[threading.Thread] = []
        done = asyncio.Event()

        def on_loop(value: int) -> None:
            ran.append(threading.current_thread())
            assert value == 7
            done.set()

        thread = threading.Thread(target=lambda: call_in_loop(loop, on_loop, 7))
        thread.start()
        await asyncio.wait_for(done.wait(), 5)
        thread.join()
        assert ran == [threading.current_thread()]

    asyncio.run(main())


def test_a_closed_loop_is_false_for_try_and_raises_for_the_others() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    assert try_call_in_loop(loop, print) is False
    with pytest.raises(RuntimeError):
        call_in_loop(loop, print)

    async def nothing() -> None:
        pass

    coro = nothing()
    with pytest.raises(RuntimeError):
        run_in_loop(loop, coro)
    coro.close()


def test_a_coroutine_from_another_thread_gives_its_result() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:

        async def double(x: int) -> int:
            return 2 * x

        assert run_in_loop(loop, double(21)).result(5) == 42
        assert try_call_in_loop(loop, loop.stop) is True
    finally:
        thread.join(5)
        loop.close()
