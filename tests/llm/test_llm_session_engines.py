"""LLMSession against both real engines (the dev engine and vLLM, SmolLM2-135M, ChatML): the token stream it
builds turn by turn (template deltas) equals the engine's full chat template, and its model tokens are
exactly what the engine returned."""

from __future__ import annotations

from prorl_server.llm import BackendPool, LLMSession, VLLMClient
from prorl_server.llm.session import missing_turn_close
from prorl_server.protocol import Trajectory

pytest_plugins = ("engine_fixtures",)

CONVERSATION = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name a fruit."},
]
OBSERVATIONS = [
    [{"role": "tool", "content": "exit code 0\nbanana  apple"}],
    [{"role": "user", "content": "And a vegetable?"}, {"role": "tool", "content": "ok"}],
]


async def test_template_deltas_equal_the_full_template_and_ids_are_the_engines(engine):
    pool = BackendPool(VLLMClient())
    pool.add(engine.address)
    session = LLMSession("fidelity", pool, Trajectory(), {"temperature": 0.0, "max_tokens": 12})
    client = pool.client
    try:
        await session.start(CONVERSATION)
        for observation in [*OBSERVATIONS, None]:
            turn = await session.generate()
            record = next(
                g for g in reversed(engine.generations()) if g.prompt_ids == session.token_ids[: turn.prompt_len]
            )
            assert turn.output_ids == record.output_ids and turn.logprobs == record.logprobs
            if observation is not None:
                await session.add_messages(observation)
        messages = session.trajectory.messages
        # The test needs assistant texts that re-encode to the sampled ids (greedy short answers do);
        # the full template of the messages must then give exactly the session's stream.
        for turn in session.trajectory.turns:
            sampled = [t for t in turn.output_ids if t not in (1, 2)]  # <|im_start|>, <|im_end|> in SmolLM2
            assert await session.tokenize(turn.text) == sampled, "precondition: canonical re-encoding"
        full = await client.tokenize_messages(engine.address, None, messages, add_generation_prompt=False)
        turn_close = await session.tokenize("<|im_end|>\n")  # what ChatML puts after an assistant message
        closed = session.token_ids + missing_turn_close(session.trajectory.turns[-1].output_ids, turn_close)
        assert closed == full
        traj = session.trajectory
        model = [t for t, m in zip(traj.response_ids, traj.response_mask, strict=True) if m == 1]
        assert model == [t for turn in traj.turns for t in turn.output_ids]
    finally:
        session.finish()
        await client.aclose_current_loop()
