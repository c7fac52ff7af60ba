"""verifiers environments as handlers: a small multi-turn environment written to verifiers' own interface
(`vf.Taskset`, `vf.Task` with a `@vf.reward`, a `vf.Env` whose `run()` plays the user) and verifiers' shipped
`user-sim` env run through the real server, the gateway and the scripted backend (the turns, the
environment's reward, the token-exact trajectory and its loss mask), and every way an environment can
misbehave failing its job cleanly.

verifiers is no part of the tests' .venv (it pins openai<3; the test extra has openai 3): these tests run in the
venv of scripts/setup-verifiers.sh, as a nested pytest that test_env_verifiers_venv.py starts with
PRORL_VERIFIERS_NESTED=1. Collected where verifiers cannot be imported, this module skips, saying so; in that
nested run it fails instead, so that the run cannot pass by skipping. Where verifiers imports (that venv, or a
developer's own with the `verifiers` extra) they run directly."""

from __future__ import annotations

import asyncio
import math
import os
import sys
import time
import types

import pytest
from server_jobs import result, submit
from trajectory_checks import assert_model_tokens_masked

NESTED_ENV = "PRORL_VERIFIERS_NESTED"  # set by test_env_verifiers_venv.py for the run it starts
try:
    import verifiers.v1 as vf  # the `verifiers` extra (not in the test extra: it pins openai<3)
except ImportError as error:
    if os.environ.get(NESTED_ENV) == "1":
        raise ImportError(f"{NESTED_ENV}=1 but verifiers.v1 does not import here ({sys.executable})") from error
    pytest.skip("runs in the verifiers venv (test_env_verifiers_venv.py)", allow_module_level=True)
from prorl_handlers.verifiers_env import VerifiersHandler  # noqa: E402

TASKSET = "prorl_test_vf_count"
WORDS = ["one", "two", "three"]


class CountData(vf.TaskData):
    """Say the words in turn; `behaviour` makes the environment misbehave on purpose."""

    words: list[str] = WORDS
    behaviour: str = "count"


class CountTask(vf.Task[CountData]):
    @vf.reward
    async def counted(self, trace: vf.Trace) -> float:
        """1 when the model said the words in order (its other replies aside)."""
        if self.data.behaviour == "raise_reward":
            raise ValueError("the grader crashed")
        if self.data.behaviour == "nan_reward":
            return math.nan
        said = [(m.content or "").strip().lower() for m in trace.assistant_messages]
        return float([word for word in said if word in self.data.words] == self.data.words)

    @vf.metric
    async def replies(self, trace: vf.Trace) -> float:
        return float(len(trace.assistant_messages))


class CountEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class CountEnv(vf.Env[CountEnvConfig]):
    """The user: after a right word it asks for the next one, after a wrong one for the same one again."""

    async def run(self, task, agents):
        count = 0
        behaviour = task.data.behaviour
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                if behaviour == "raise_run":
                    raise RuntimeError("no database")
                if behaviour == "slow":
                    await asyncio.sleep(30)
                if behaviour == "never_done":
                    segment = await interaction.turn("Again.")
                    continue
                if behaviour == "image_turn":
                    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                    segment = await interaction.turn([{"role": "user", "content": [image]}])
                    continue
                if behaviour == "assistant_turn":
                    segment = await interaction.turn([{"role": "assistant", "content": "two"}])
                    continue
                if segment.last_reply.lower() == task.data.words[count]:
                    count += 1
                if count == len(task.data.words):
                    break
                segment = await interaction.turn(f"Now say {task.data.words[count]}.")


class CountTaskset(vf.Taskset[CountTask, vf.TasksetConfig]):
    def load(self):
        for words in (WORDS, ["red", "green"]):
            yield CountTask(CountData(prompt=f"Say {words[0]}.", system_prompt="Count.", words=words), self.config.task)


class BrokenTaskset(vf.Taskset[CountTask, vf.TasksetConfig]):
    def load(self):
        raise OSError("the dataset is not there")


def _module(name: str, *exports: type) -> None:
    """A verifiers plugin in the server's process: a module exporting its classes in `__all__`."""
    module = types.ModuleType(name)
    for cls in exports:
        setattr(module, cls.__name__, cls)
    module.__all__ = [cls.__name__ for cls in exports]
    sys.modules[name] = module


_module(TASKSET, CountTaskset, CountEnv)
_module("prorl_test_vf_broken", BrokenTaskset)
_module("prorl_test_vf_plain", CountTaskset)  # no Env of its own: verifiers' SingleAgentEnv plays it


@pytest.fixture
def env_server(start_server, backend):
    """A prorl-server with the verifiers handler and the scripted backend."""
    server = start_server([backend.address], handlers={"verifiers": VerifiersHandler()})
    server.state.gateway.public_url = server.url  # the test server binds a free port
    return server


def count_task(**fields) -> dict:
    return {
        "data_source": "verifiers",
        "taskset": TASKSET,
        "task": {"prompt": "Say one.", "system_prompt": "Count."},
        **fields,
    }


def process(server, instance: dict, **sampling) -> dict:
    body = {"instance": instance, "sampling_params": {"max_tokens": 16, **sampling}, "timeout": 60}
    return server.http.post("/process", json=body).json()


def test_an_environment_needing_three_turns_reaches_its_rubrics_reward(env_server, backend):
    backend.double.push("one", "two", "three")
    result = process(env_server, count_task())

    assert result["status"] == "completed", result["error"]
    assert result["reward"] == 1.0
    [trace] = result["eval"]["traces"]
    assert trace == {
        "agent": "player",
        "trainable": True,
        "reward": 1.0,
        "rewards": {"counted": 1.0},
        "metrics": {"replies": 3.0},
        "stop_condition": "user_closed",
        "turns": 3,
    }
    traj = result["trajectory"]
    assert [m["role"] for m in traj["messages"]] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert [m["content"] for m in traj["messages"][3::2]] == ["Now say two.", "Now say three."]
    assert len(traj["turns"]) == 3
    assert_model_tokens_masked(traj)  # the environment's user turns are mask 0
    [recording] = result["artifacts"]["gateway"]  # every turn through the gateway, as one conversation
    [segment] = recording["segments"]
    assert recording["calls"] == 3 and recording["rewrites"] == 0
    assert {k: traj[k] for k in segment} == segment  # the recorded segment is the job's trajectory


def test_a_wrong_turn_is_observed_and_the_right_ones_still_score(env_server, backend):
    backend.double.push("one", "five", "two", "three")
    result = process(env_server, count_task(max_turns=5), seed=1)

    assert result["status"] == "completed", result["error"]
    assert result["reward"] == 1.0 and result["eval"]["turns"] == 4
    assert [m["content"] for m in result["trajectory"]["messages"][3::2]] == ["Now say two."] * 2 + ["Now say three."]
    assert_model_tokens_masked(result["trajectory"])


def test_concurrent_episodes_each_reach_their_own_session(env_server, backend):
    backend.double.push("one", "two", "three", job="a")
    backend.double.push("one", "five", "two", "three", job="b")
    for job_id, max_turns in (("a", 3), ("b", 4)):
        submit(env_server, job_id, instance=count_task(max_turns=max_turns), sampling_params={"max_tokens": 16})

    for job_id, turns in (("a", 3), ("b", 4)):
        res = result(env_server, job_id, timeout=60)
        assert res["status"] == "completed" and res["reward"] == 1.0, res["error"]
        assert len(res["trajectory"]["turns"]) == turns
        assert_model_tokens_masked(res["trajectory"])
    assert not [name for name in os.environ if name.startswith("PRORL_VERIFIERS_KEY_")]  # removed at release


def test_a_task_of_the_tasksets_own_load_is_taken_by_index(env_server, backend):
    backend.double.push("red", "green")
    result = process(env_server, {"data_source": "verifiers", "taskset": TASKSET, "index": 1})

    assert result["status"] == "completed", result["error"]
    assert result["reward"] == 1.0
    assert result["trajectory"]["messages"][1]["content"] == "Say red."
    assert result["trajectory"]["messages"][3]["content"] == "Now say green."


def test_a_plain_taskset_runs_in_verifiers_single_agent_env(env_server, backend):
    backend.double.push("one")
    result = process(env_server, {"data_source": "verifiers", "taskset": "prorl_test_vf_plain", "index": 0})

    assert result["status"] == "completed", result["error"]
    [trace] = result["eval"]["traces"]
    assert trace["agent"] == "agent" and trace["stop_condition"] == "agent_completed" and trace["turns"] == 1
    assert result["reward"] == 0.0  # one word of three
    assert_model_tokens_masked(result["trajectory"])


def test_verifiers_own_user_sim_env_plays_the_user_with_the_policy(env_server, backend):
    backend.double.push("Please say one.", "one", "###DONE###")
    instance = count_task(env="user-sim", task={"prompt": "Get the assistant to say one.", "words": ["one"]})
    result = process(env_server, instance)

    assert result["status"] == "completed", result["error"]
    traces = {t["agent"]: t for t in result["eval"]["traces"]}
    assert traces["user"]["trainable"] is False and traces["user"]["turns"] == 2
    assert traces["assistant"]["trainable"] is True and traces["assistant"]["rewards"] == {"counted": 1.0}
    assert traces["assistant"]["metrics"]["user_turns"] == 2.0  # the env's own finalize()
    assert result["reward"] == 1.0  # the trainable trace's
    # the user called the policy as a side call of its own, so the assistant's conversation is the job's trajectory
    [recording] = result["artifacts"]["gateway"]
    assert recording["calls"] == 3 and recording["side_calls"] == 2
    models = {chain["id"]: (chain["model"], chain["side_call"]) for chain in recording["chains"]}
    assert [models[i] for i in recording["reward_chains"]] == [("policy", False)]
    assert ("verifiers-user", True) in models.values()
    traj = result["trajectory"]
    assert [(m["role"], m["content"]) for m in traj["messages"]] == [("user", "Please say one."), ("assistant", "one")]
    assert_model_tokens_masked(traj)


def test_an_environment_that_never_ends_is_stopped_by_max_turns(env_server, backend):
    backend.double.push("a", "b", "c")
    result = process(env_server, count_task(task={"prompt": "Say one.", "behaviour": "never_done"}, max_turns=3))

    assert result["status"] == "completed", result["error"]
    assert result["reward"] == 0.0
    [trace] = result["eval"]["traces"]
    assert trace["stop_condition"] == "max_turns" and trace["turns"] == 3
    assert result["trajectory"]["messages"][-1]["role"] == "assistant"  # the refused turn reached no model
    assert_model_tokens_masked(result["trajectory"])


def test_unknown_tasksets_and_envs_fail_in_init_naming_them_and_the_known_ones(env_server):
    result = process(env_server, count_task(taskset="no_such_taskset"))
    assert result["status"] == "failed"
    assert result["error"]["stage"] == "init" and result["error"]["type"] == "UnknownEnvironment"
    assert "'no_such_taskset'" in result["error"]["message"] and "textarena" in result["error"]["message"]

    result = process(env_server, count_task(env="no-such-env"))
    assert result["error"]["type"] == "UnknownEnvironment"
    assert "'no-such-env'" in result["error"]["message"] and "user_sim" in result["error"]["message"]

    result = process(env_server, count_task(env_config={"player": {"harness": {"id": "bash"}}}))
    assert result["error"]["type"] == "UnknownEnvironment"
    assert "pins the harness 'bash'" in result["error"]["message"]


@pytest.mark.parametrize(
    ("behaviour", "kind", "message"),
    [
        ("raise_run", "EnvironmentFailed", "episode failed: EnvError: CountEnv.run(): RuntimeError: no database"),
        ("raise_reward", "EnvironmentFailed", "TaskError: task CountTask scoring: ValueError: the grader crashed"),
        ("nan_reward", "MalformedObservation", "returned a non-finite reward 'counted': nan"),
        ("image_turn", "MalformedObservation", "observation after turn 1: message 0: content that is not text"),
        ("assistant_turn", "MalformedObservation", "observation after turn 1: message 0: role 'assistant'"),
    ],
)
def test_a_misbehaving_environment_fails_its_job_naming_it(env_server, backend, behaviour, kind, message):
    backend.double.push("one", "two", "three")
    result = process(env_server, count_task(task={"prompt": "Say one.", "behaviour": behaviour}))

    assert result["status"] == "failed", result
    assert result["error"]["stage"] == "run" and result["error"]["type"] == kind
    assert f"environment {TASKSET!r}" in result["error"]["message"]
    assert message in result["error"]["message"]
    assert result["trajectory"]["turns"]  # the turns before the failure are kept
    assert_model_tokens_masked(result["trajectory"])


def test_a_model_call_the_gateway_refuses_fails_the_job(start_server, strict):
    server = start_server([strict.address], handlers={"verifiers": VerifiersHandler()})
    server.state.gateway.public_url = server.url
    result = process(server, count_task())  # the strict backend has no reply queued: the completion fails

    assert result["status"] == "failed"
    assert result["error"]["stage"] == "run" and result["error"]["type"] == "EnvironmentFailed"
    assert "episode failed: ProviderError: upstream 400" in result["error"]["message"]  # verifiers' own record


def test_an_episode_past_its_timeout_fails_the_job_at_once(env_server, backend):
    backend.double.push("one")
    started = time.monotonic()
    result = process(env_server, count_task(task={"prompt": "Say one.", "behaviour": "slow"}, episode_timeout=0.5))

    assert result["status"] == "failed"
    assert result["error"]["type"] == "EnvironmentFailed"
    assert f"{TASKSET!r} episode: no end within 0.5 s" in result["error"]["message"]
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("instance", "kind", "message"),
    [
        (
            {"data_source": "verifiers", "taskset": "prorl_test_vf_broken", "index": 0},
            "EnvironmentFailed",
            "'prorl_test_vf_broken' task raised OSError: the dataset is not there",
        ),
        (count_task(index=None, task=None, taskset=TASKSET) | {"index": 5}, "EnvAdapterError", "has no task 5"),
        (count_task(task={"prompt": "Say one.", "words": "one"}), "EnvAdapterError", "is no CountData"),
        (count_task(taskset_config={"no_such_knob": 1}), "EnvAdapterError", "verifiers refused the config"),
    ],
)
def test_a_task_that_cannot_be_built_fails_in_init(env_server, instance, kind, message):
    result = process(env_server, instance)

    assert result["status"] == "failed", result
    assert result["error"]["stage"] == "init" and result["error"]["type"] == kind
    assert message in result["error"]["message"]


@pytest.mark.parametrize(
    ("instance", "field"),
    [
        ({"data_source": "verifiers", "index": 0}, "taskset"),
        ({"data_source": "verifiers", "taskset": TASKSET}, "exactly one of `task`"),
        (count_task(index=0), "exactly one of `task`"),
        (count_task(max_turns=10_000), "max_turns"),
        (count_task(env_config={"id": "user-sim"}), "env_config"),
    ],
)
def test_an_instance_of_the_wrong_shape_is_refused_at_submission(env_server, instance, field):
    response = env_server.http.post("/process", json={"instance": instance, "timeout": 30})

    assert response.status_code == 400
    assert field in response.json()["detail"]


def test_without_verifiers_installed_the_failure_says_how_to_install_it(monkeypatch):
    from prorl_handlers.env_adapters import EnvAdapterError
    from prorl_handlers.verifiers_env.handler import import_verifiers

    monkeypatch.setitem(sys.modules, "verifiers.v1", None)  # `import verifiers.v1` raises ImportError
    with pytest.raises(EnvAdapterError, match=r"pip install 'prorl-server\[verifiers\]'"):
        import_verifiers()
