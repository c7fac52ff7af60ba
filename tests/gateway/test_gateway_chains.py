"""A gateway session's chains, on the scripted test double through the official `openai` and `anthropic`
clients: interleaved sub-agent chains stay apart and token-exact (the stored ids reused, never
re-tokenized), a compaction and a rollback each open one new segment of their chain, side calls are chains
of their own or refused, the chain limit, a handler's reward chains, and the trainer's batch of a chosen
chain; and the matching rules themselves, without a server."""

from __future__ import annotations

import anthropic
import openai
import pytest
from gateway_sessions import close_session, open_session
from server_jobs import result, submit

from prorl_server import AgentHandler, JobContext
from prorl_server.gateway.chains import Chain, Move, digest, place
from prorl_server.testing import ScriptedReply
from prorl_server.testing.scripted_backend import MODEL_NAME, ToyChatTokenizer

TOK = ToyChatTokenizer()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]
CALL_TEXT = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
MAIN = "You are the main agent."
SUB_A = "You are sub-agent A."
SUB_B = "You are sub-agent B."
ODD = "<|endoftext|>"  # sampled as its characters, one id each: re-tokenized, it would be the one special id
ODD_IDS = [ord(c) + ToyChatTokenizer.OFFSET for c in ODD]


@pytest.fixture
def server(start_server, strict):
    return start_server([strict.address])


def client_for(session: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0, timeout=60)


def anthropic_for(session: dict) -> anthropic.Anthropic:
    url = session["base_url"].removesuffix("/v1")
    return anthropic.Anthropic(base_url=url, api_key=session["api_key"], max_retries=0, timeout=60)


def toy_template(messages: list[dict], add_generation_prompt: bool) -> list[int]:
    return TOK.encode(TOK.render(messages, add_generation_prompt))


def script(strict, prompt: str, *texts: str) -> list[ScriptedReply]:
    """Queue replies for prompts containing `prompt`, each with logprobs of its own (the odd text as its
    characters' ids); the replies."""
    replies = []
    for text in texts:
        step = -0.01 * (len(strict.double.script()["prompts"]) * 10 + len(replies) + 1)
        if text == ODD:
            replies.append(ScriptedReply(ids=[*ODD_IDS, TOK.eos_id], logprobs=[step] * (len(ODD_IDS) + 1)))
        else:
            replies.append(ScriptedReply(text=text, logprobs=[step] * (len(TOK.encode(text)) + 1)))
    strict.double.push(*replies, prompt=prompt)
    return replies


def assert_token_exact(record: dict, strict, scripted: list[ScriptedReply]) -> None:
    """Every turn of every chain holds the prompt the double was sent and the ids and logprobs it returned;
    the mask is 1 on those ids alone; every completion the double answered is one turn."""
    sent = [r.prompt for r in strict.double.requests]
    returned = {
        (tuple(r.ids) if r.ids is not None else (*TOK.encode(r.text or ""), TOK.eos_id)): r.logprobs for r in scripted
    }
    turns = 0
    for chain in record["chains"]:
        for segment in chain["segments"]:
            context = segment["prompt_ids"] + segment["response_ids"]
            marked = [i for i, m in zip(segment["response_ids"], segment["response_mask"], strict=True) if m]
            assert marked == [i for turn in segment["turns"] for i in turn["output_ids"]]
            for turn in segment["turns"]:
                start, ids = turn["prompt_len"], turn["output_ids"]
                assert context[:start] in sent  # exactly what the engine was sent for it
                assert context[start : start + len(ids)] == ids
                assert returned[tuple(ids)] == turn["logprobs"]
                offset = start - len(segment["prompt_ids"])
                assert segment["response_logprobs"][offset : offset + len(ids)] == turn["logprobs"]
                turns += 1
    assert turns == len(sent) == sum(len(s["turns"]) for s in record["segments"])


def texts(chain: dict) -> list[list[str]]:
    return [[t["text"] for t in segment["turns"]] for segment in chain["segments"]]


def test_interleaved_sub_agents_are_chains_of_their_own_each_token_exact_openai(strict, server):
    scripted = (
        script(strict, MAIN, CALL_TEXT, "m2", "m3")
        + script(strict, SUB_A, ODD, "a2")
        + script(strict, SUB_B, "b1", "b2")
    )
    session = open_session(server)
    client = client_for(session)

    def ask(history: list, **extra) -> openai.types.chat.ChatCompletionMessage:
        message = client.chat.completions.create(model=MODEL_NAME, messages=history, **extra).choices[0].message
        history.append(message.model_dump())
        return message

    main = [{"role": "system", "content": MAIN}, {"role": "user", "content": "Fix the bug."}]
    a = [{"role": "system", "content": SUB_A}, {"role": "user", "content": "Find the file."}]
    b = [{"role": "system", "content": SUB_B}, {"role": "user", "content": "Run the tests."}]
    [call] = ask(main, tools=TOOLS).tool_calls
    main.append({"role": "tool", "tool_call_id": call.id, "content": "a.py"})
    assert ask(a).content == ODD
    a.append({"role": "user", "content": "go on"})
    assert ask(main, tools=TOOLS).content == "m2"
    assert ask(b).content == "b1"
    assert ask(a).content == "a2"
    b.append({"role": "user", "content": "again"})
    main.append({"role": "user", "content": "and?"})
    assert ask(main, tools=TOOLS).content == "m3"
    assert ask(b).content == "b2"

    record = close_session(server, session)
    assert (record["calls"], record["rewrites"], record["side_calls"]) == (7, 0, 0)
    assert [c["id"] for c in record["chains"]] == [0, 1, 2] and record["main_chain"] == 0
    assert record["reward_chains"] == [0]
    assert [texts(c) for c in record["chains"]] == [[[CALL_TEXT, "m2", "m3"]], [[ODD, "a2"]], [["b1", "b2"]]]
    assert [c["sampled_tokens"] for c in record["chains"]] == [
        sum(len(t["output_ids"]) for s in c["segments"] for t in s["turns"]) for c in record["chains"]
    ]
    assert_token_exact(record, strict, scripted)
    # A's second turn went on from the ids A's first sampled, not from its text tokenized again
    [a_segment] = record["chains"][1]["segments"]
    assert a_segment["turns"][1]["prompt_len"] > len(a_segment["prompt_ids"]) + len(ODD_IDS)
    assert a_segment["response_ids"][: len(ODD_IDS)] == ODD_IDS
    # the old field: every segment, in the order they started
    assert record["segments"] == [c["segments"][0] for c in record["chains"]]


def test_interleaved_sub_agents_are_chains_of_their_own_each_token_exact_anthropic(strict, server):
    scripted = script(strict, MAIN, "m1", "m2", "m3") + script(strict, SUB_A, "a1", "a2") + script(strict, SUB_B, "b1")
    session = open_session(server)
    client = anthropic_for(session)
    conversations: dict[str, list] = {s: [{"role": "user", "content": f"task of {s}"}] for s in (MAIN, SUB_A, SUB_B)}

    def ask(system: str) -> str:
        history = conversations[system]
        reply = client.messages.create(model=MODEL_NAME, max_tokens=64, system=system, messages=history)
        history += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": "next"}]
        return reply.content[0].text

    assert [ask(s) for s in (MAIN, SUB_A, MAIN, SUB_B, SUB_A, MAIN)] == ["m1", "a1", "m2", "b1", "a2", "m3"]
    record = close_session(server, session)
    assert (record["calls"], record["rewrites"], record["main_chain"]) == (6, 0, 0)
    assert [texts(c) for c in record["chains"]] == [[["m1", "m2", "m3"]], [["a1", "a2"]], [["b1"]]]
    assert_token_exact(record, strict, scripted)


def test_a_compaction_opens_one_new_segment_of_its_chain_and_the_sub_agent_is_untouched(strict, server):
    scripted = script(strict, MAIN, "m1", "m2", "m3", "m4") + script(strict, SUB_A, "a1", "a2")
    session = open_session(server)
    client = client_for(session)

    def ask(history: list) -> None:
        history.append(
            client.chat.completions.create(model=MODEL_NAME, messages=history).choices[0].message.model_dump()
        )

    main = [{"role": "system", "content": MAIN}, {"role": "user", "content": "Fix the bug."}]
    a = [{"role": "system", "content": SUB_A}, {"role": "user", "content": "Find the file."}]
    ask(main)
    ask(a)
    main.append({"role": "user", "content": "more"})
    ask(main)
    # compaction: the system prompt and the task kept, the exchanges since summarised
    compacted = [*main[:2], {"role": "user", "content": "Summary: m1, more, m2. Go on."}]
    ask(compacted)
    a.append({"role": "user", "content": "go on"})
    ask(a)
    compacted.append({"role": "user", "content": "done?"})
    ask(compacted)

    record = close_session(server, session)
    assert (record["calls"], record["rewrites"]) == (6, 1)
    main_chain, sub = record["chains"]
    assert texts(main_chain) == [["m1", "m2"], ["m3", "m4"]] and main_chain["rewrites"] == 1
    assert texts(sub) == [["a1", "a2"]] and sub["rewrites"] == 0
    assert main_chain["segments"][1]["prompt_ids"] == toy_template(compacted[:3], True)
    assert [len(c["segments"]) for c in record["chains"]] == [2, 1] and len(record["segments"]) == 3
    assert_token_exact(record, strict, scripted)


def test_a_rollback_of_the_last_assistant_turn_starts_a_segment_from_the_ids_it_was_sampled_from(strict, server):
    scripted = script(strict, MAIN, ODD, "m2", "m2 again", "m3")
    session = open_session(server)
    client = client_for(session)
    history = [{"role": "system", "content": MAIN}, {"role": "user", "content": "Fix the bug."}]
    for follow_up in ("more", None):
        history.append(
            client.chat.completions.create(model=MODEL_NAME, messages=history).choices[0].message.model_dump()
        )
        if follow_up:
            history.append({"role": "user", "content": follow_up})
    rolled_back = history[:-1]  # the harness drops the last reply and samples that turn again
    again = client.chat.completions.create(model=MODEL_NAME, messages=rolled_back).choices[0].message
    assert again.content == "m2 again"
    client.chat.completions.create(
        model=MODEL_NAME, messages=[*rolled_back, again.model_dump(), {"role": "user", "content": "next"}]
    )

    record = close_session(server, session)
    assert (record["calls"], record["rewrites"], len(record["chains"])) == (4, 1, 1)
    [chain] = record["chains"]
    first, second = chain["segments"]
    assert texts(chain) == [[ODD, "m2"], ["m2 again", "m3"]]
    # the new segment's prompt is the very ids the rolled-back turn was sampled from (the odd ids kept)
    assert second["prompt_ids"] == (first["prompt_ids"] + first["response_ids"])[: first["turns"][1]["prompt_len"]]
    assert second["prompt_ids"] != toy_template(rolled_back, True)
    assert_token_exact(record, strict, scripted)


def test_a_side_call_under_another_model_name_is_its_own_chain(strict, server):
    scripted = script(strict, "Title:", "A title") + script(strict, MAIN, "m1", "m2")  # the title's prompt has both
    session = open_session(server, model="big-model", accept_any_model=True)
    client = client_for(session)
    history = [{"role": "system", "content": MAIN}, {"role": "user", "content": "Fix the bug."}]
    history.append(client.chat.completions.create(model="big-model", messages=history).choices[0].message.model_dump())
    # a title, by the harness's small model, of the conversation so far: it extends the main chain's messages
    title = [*history, {"role": "user", "content": "Title: say it in three words."}]
    assert client.chat.completions.create(model="small-model", messages=title).choices[0].message.content == "A title"
    history.append({"role": "user", "content": "more"})
    client.chat.completions.create(model="big-model", messages=history)

    record = close_session(server, session)
    assert (record["calls"], record["side_calls"], record["rewrites"]) == (3, 1, 0)
    main_chain, side = record["chains"]
    assert (main_chain["model"], main_chain["side_call"], texts(main_chain)) == ("big-model", False, [["m1", "m2"]])
    assert (side["model"], side["side_call"], texts(side)) == ("small-model", True, [["A title"]])
    assert record["main_chain"] == 0 and record["reward_chains"] == [0]
    assert_token_exact(record, strict, scripted)


def test_side_calls_are_refused_in_each_dialects_shape_when_the_session_says_so(strict, server):
    script(strict, MAIN, "m1")
    session = open_session(server, model="big-model", accept_any_model=True, side_calls="refuse")
    history = [{"role": "system", "content": MAIN}, {"role": "user", "content": "Fix the bug."}]
    with pytest.raises(openai.NotFoundError) as refused:
        client_for(session).chat.completions.create(model="small-model", messages=history)
    assert refused.value.code == "side_call_refused"
    with pytest.raises(anthropic.NotFoundError) as refused_too:
        anthropic_for(session).messages.create(model="small-model", max_tokens=8, messages=history[1:])
    assert "side_calls 'refuse'" in refused_too.value.message
    assert (
        client_for(session).chat.completions.create(model="big-model", messages=history).choices[0].message.content
        == "m1"
    )
    record = close_session(server, session)
    assert (record["calls"], record["side_calls"], record["failed_calls"], len(record["chains"])) == (1, 0, 0, 1)
    assert len(strict.double.requests) == 1  # the refused calls reached no backend


def test_chains_are_capped_and_a_rewrite_of_a_chain_is_still_taken(strict, start_server):
    server = start_server([strict.address], gateway_max_chains=2)
    strict.double.push("one", "two", "three")
    session = open_session(server)
    client = client_for(session)
    for question in ("q1", "q2"):
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": question}])
    with pytest.raises(openai.BadRequestError) as capped:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "q3"}])
    assert capped.value.code == "too_many_chains"
    edited = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "ONE"},
        {"role": "user", "content": "u"},
    ]
    assert client.chat.completions.create(model=MODEL_NAME, messages=edited).choices[0].message.content == "three"
    record = close_session(server, session)
    assert [texts(c) for c in record["chains"]] == [[["one"], ["three"]], [["two"]]] and record["rewrites"] == 1


class SubAgentHandler(AgentHandler):
    """A main agent that asks a sub-agent once, through its job's session; the reward chains as the
    instance says."""

    name = "sub_agent"

    async def run(self, ctx: JobContext) -> None:
        access = await ctx.gateway_session(reward_chains=ctx.instance["reward_chains"])
        client = openai.AsyncOpenAI(base_url=access.base_url, api_key=access.api_key, max_retries=0)
        try:
            main = [{"role": "system", "content": MAIN}, {"role": "user", "content": "6 x 7?"}]
            first = await client.chat.completions.create(model=access.model, messages=main)
            main.append(first.choices[0].message.model_dump())
            sub = [{"role": "system", "content": SUB_A}, {"role": "user", "content": "multiply 6 by 7"}]
            found = (await client.chat.completions.create(model=access.model, messages=sub)).choices[0].message
            main.append({"role": "user", "content": f"the sub-agent says {found.content}"})
            reply = await client.chat.completions.create(model=access.model, messages=main)
        finally:
            await client.close()
        ctx.artifacts["answer"] = reply.choices[0].message.content

    async def eval(self, ctx: JobContext) -> float:
        return 1.0 if ctx.artifacts.get("answer") == "42" else 0.0


@pytest.mark.parametrize("reward_chains", ["main", "agents"])
def test_the_handler_picks_the_reward_chains_and_the_trainer_batches_a_chosen_chain(
    strict, start_server, reward_chains
):
    from prorl_server.protocol import JobResult
    from prorl_server.training import chain_trajectories, token_batch

    server = start_server([strict.address], handlers={"sub_agent": SubAgentHandler()})
    server.state.gateway.public_url = server.url
    strict.double.push("asking", "42 it is", "42", job="j1")
    submit(server, "j1", instance={"data_source": "sub_agent", "reward_chains": reward_chains})
    res = result(server, "j1")
    assert res["status"] == "completed" and res["reward"] == 1.0, res["error"]
    [recording] = res["artifacts"]["gateway"]
    main_chain, sub = recording["chains"]
    assert texts(main_chain) == [["asking", "42"]] and texts(sub) == [["42 it is"]]
    assert recording["main_chain"] == 0
    job = JobResult.model_validate(res)
    if reward_chains == "main":  # one chain of one segment: also the job's trajectory
        assert recording["reward_chains"] == [0]
        assert res["trajectory"]["response_ids"] == main_chain["segments"][0]["response_ids"]
    else:
        assert recording["reward_chains"] == [0, 1] and res["trajectory"]["response_ids"] == []
    rewarded = chain_trajectories(job)
    assert [t.response_ids for t in rewarded] == [
        c["segments"][0]["response_ids"] for c in recording["chains"] if c["id"] in recording["reward_chains"]
    ]
    batch = token_batch([job], [0.5], pad_id=0, chain=1)  # the sub-agent's chain alone
    segment = sub["segments"][0]
    assert batch.rows == 1 and batch.input_ids[0].tolist() == segment["prompt_ids"] + segment["response_ids"]
    assert batch.model_tokens == sub["sampled_tokens"] and batch.advantages.tolist() == [0.5]
    both = token_batch([job], [1.0], pad_id=0, chain="reward")
    assert both.rows == len(rewarded) and both.advantages.tolist() == [1.0] * len(rewarded)
    with pytest.raises(ValueError, match="no 7 chain"):
        token_batch([job], [1.0], pad_id=0, chain=7)


# the matching rules, without a server ------------------------------------------------------------


def chain(chain_id: int, keys: list[str], *, sampled: bool = True, side: str | None = None, used: int = 0) -> Chain:
    digests = [digest(k) for k in keys]
    model = side or MODEL_NAME
    made = Chain(chain_id, model, side is not None, tuple(digests[:2]), keys=digests, sampled=sampled, last_used=used)
    made.turn_starts = [(len(keys) - 1, 100 + chain_id)] if sampled else []
    return made


def where(chains: list[Chain], keys: list[str], pool: str | None = None, tools: bytes = b"") -> tuple[Move, int | None]:
    digests = [digest(k) for k in keys]
    placed = place(chains, pool, digests, tuple(digests[:2]), tools)
    return placed.move, placed.chain.id if placed.chain is not None else None


def test_a_call_joins_the_chain_it_extends_longest_and_only_in_its_model_pool():
    short = chain(0, ["s", "u", "r1"])
    long = chain(1, ["s", "u", "r1", "t", "r2"])
    other = chain(2, ["s2", "u2", "r"], side="small")
    chains = [short, long, other]
    assert where(chains, ["s", "u", "r1", "t", "r2", "t2"]) == (Move.CONTINUE, 1)  # both extend: the longer
    assert where(chains, ["s", "u", "r1", "x"]) == (Move.CONTINUE, 0)
    assert where(chains, ["s2", "u2", "r", "t"]) == (Move.NEW, None)  # the side call's chain is not this pool's
    assert where(chains, ["s2", "u2", "r", "t"], pool="small") == (Move.CONTINUE, 2)
    assert where(chains, ["s", "u", "r1", "x"], tools=digest("tools")) == (Move.REWRITE, 0)  # other tools


def test_a_retry_a_rollback_a_rewrite_and_a_new_chain_are_told_apart():
    failed = chain(0, ["s", "u", "r1", "t"], sampled=False)
    answered = chain(1, ["s", "v", "r1", "t", "r2"], used=5)
    chains = [failed, answered]
    assert where(chains, ["s", "u", "r1", "t"]) == (Move.RETRY, 0)
    placed = place(chains, None, [digest(k) for k in ["s", "v", "r1", "t"]], (digest("s"), digest("v")), b"")
    assert (placed.move, placed.chain, placed.prompt_len) == (Move.ROLLBACK, answered, 101)
    assert where(chains, ["s", "v", "summary"]) == (Move.REWRITE, 1)
    assert where(chains, ["s", "w"]) == (Move.NEW, None)
    twin = chain(2, ["s", "v", "r9"], used=9)
    assert where([answered, twin], ["s", "v", "r1", "edited"]) == (Move.REWRITE, 1)  # the longest shared prefix
    assert where([answered, twin], ["s", "v", "other"]) == (Move.REWRITE, 2)  # a tie: the latest used
