"""Ecosystem environments as handlers: a skyrl-gym text environment run multi-turn through the real server
and the scripted backend (turns, the reward, the loss mask), and every way an environment can misbehave
failing its job cleanly."""

from __future__ import annotations

import sys
import time

import pytest
from trajectory_checks import assert_model_tokens_masked

skyrl_gym = pytest.importorskip("skyrl_gym")  # the `environments` extra (the test extra has it)
from prorl_handlers.skyrl_gym import SkyRLGymHandler  # noqa: E402
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput  # noqa: E402

WORDS = ["one", "two", "three"]
CLOSED: list[int] = []  # ids of the CountEnvs closed


class CountEnv(BaseTextEnv):
    """Say one, two, three in turn: each right word earns nothing until the last, which earns 1 and ends the
    episode; a wrong word is told so and the count goes on from where it was. `extras["behaviour"]` makes it
    misbehave on purpose, at step `extras["at"]`."""

    def __init__(self, env_config=None, extras=None):
        super().__init__()
        extras = extras or {}
        self.behaviour = extras.get("behaviour", "count")
        self.at = int(extras.get("at", 1))
        self.role = env_config.get("role", "user") if env_config is not None else "user"
        self.count = 0  # words said right so far
        if self.behaviour == "raise_make":
            raise RuntimeError("no database")

    def init(self, prompt):
        if self.behaviour == "raise_init":
            raise RuntimeError("cannot load the task")
        if self.behaviour == "bad_init":
            return "just text", {}
        return prompt, {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        if self.turns == self.at:
            bad = self.misbehave()
            if bad is not None:
                return bad
        if self.behaviour == "never_done":
            return BaseTextEnvStepOutput(
                observations=[{"role": "user", "content": "again"}], reward=0.0, done=False, metadata={}
            )
        if action.strip().lower() == WORDS[self.count]:
            self.count += 1
        done = self.count == len(WORDS)
        obs = [] if done else [{"role": self.role, "content": f"Now say {WORDS[self.count]}."}]
        return BaseTextEnvStepOutput(
            observations=obs, reward=1.0 if done else 0.0, done=done, metadata={"count": self.count}
        )

    def misbehave(self):
        match self.behaviour:
            case "raise_step":
                raise ValueError("the grader crashed")
            case "text_observation":
                return {"observations": "Now say two.", "reward": 0.0, "done": False, "metadata": {}}
            case "assistant_observation":
                return {"observations": [{"role": "assistant", "content": "two"}], "reward": 0.0, "done": False}
            case "bad_reward":
                return {"observations": [], "reward": "lots", "done": False}
            case "no_done":
                return {"observations": [], "reward": 0.0}
            case "not_a_dict":
                return "done"
            case "slow":
                time.sleep(2)
        return None

    def close(self):
        CLOSED.append(id(self))

    def get_metrics(self):
        return {"count": self.count}


if "prorl_test_count" not in skyrl_gym.registry:
    skyrl_gym.register(id="prorl_test_count", entry_point=CountEnv)


@pytest.fixture
def env_server(start_server, backend):
    """A prorl-server with the skyrl_gym handler and the scripted backend."""
    return start_server([backend.address], handlers={"skyrl_gym": SkyRLGymHandler()})


def count_task(**fields) -> dict:
    prompt = [{"role": "system", "content": "Count."}, {"role": "user", "content": "Say one."}]
    return {"data_source": "skyrl_gym", "env_class": "prorl_test_count", "prompt": prompt, **fields}


def process(server, instance: dict, **sampling) -> dict:
    body = {"instance": instance, "sampling_params": {"max_tokens": 16, **sampling}, "timeout": 60}
    return server.http.post("/process", json=body).json()


def test_an_environment_needing_three_turns_reaches_reward_one(env_server, backend):
    backend.double.push("one", "two", "three")
    closed = len(CLOSED)
    result = process(env_server, count_task())

    assert result["status"] == "completed", result["error"]
    assert result["reward"] == 1.0
    assert result["eval"] == {"step_rewards": [0.0, 0.0, 1.0], "turns": 3, "ended": "done"}
    assert result["artifacts"]["metrics"] == {"count": 3}
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
    assert_model_tokens_masked(traj)  # the environment's observations are mask 0
    assert len(CLOSED) == closed + 1  # env.close() ran at the release


def test_a_wrong_turn_is_observed_and_the_step_rewards_are_summed(env_server, backend):
    backend.double.push("one", "five", "two", "three")
    result = process(env_server, count_task(max_turns=5), seed=1)

    assert result["status"] == "completed", result["error"]
    assert result["reward"] == 1.0 and result["eval"]["turns"] == 4
    assert [m["content"] for m in result["trajectory"]["messages"][3::2]] == ["Now say two."] * 2 + ["Now say three."]
    assert_model_tokens_masked(result["trajectory"])


def test_tool_observations_are_appended_as_tool_messages(env_server, backend):
    backend.double.push("one", "two", "three")
    result = process(env_server, count_task(env_config={"role": "tool"}))

    assert result["status"] == "completed", result["error"]
    assert [m["role"] for m in result["trajectory"]["messages"][3::2]] == ["tool", "tool"]
    assert_model_tokens_masked(result["trajectory"])


def test_skyrls_own_multi_turn_gsm8k_environment_runs(env_server, backend):
    backend.double.push("I think it is 41.", "#### 42")
    task = {
        "data_source": "skyrl_gym",
        "env_class": "gsm8k_multi_turn",
        "prompt": "Natalia sold 42 clips. How many? End with '#### ANSWER'.",
        "reward_spec": {"method": "rule", "ground_truth": "42"},
        "extra_info": {},
        "max_turns": 3,
    }
    result = process(env_server, task)

    assert result["status"] == "completed", result["error"]
    assert result["eval"]["step_rewards"] == [0.0, 1.0] and result["reward"] == 1.0
    assert result["eval"]["ended"] == "done" and len(result["trajectory"]["turns"]) == 2
    assert "#### ANSWER" in result["trajectory"]["messages"][2]["content"]  # the env's own follow-up
    assert_model_tokens_masked(result["trajectory"])


def test_an_environment_that_never_ends_is_stopped_by_max_turns(env_server, backend):
    backend.double.push("a", "b", "c")
    result = process(env_server, count_task(behaviour="never_done", max_turns=3))

    assert result["status"] == "completed", result["error"]
    assert result["reward"] == 0.0
    assert result["eval"] == {"step_rewards": [0.0, 0.0, 0.0], "turns": 3, "ended": "max_turns"}
    assert result["trajectory"]["messages"][-1]["role"] == "assistant"  # no observation after the last turn
    assert_model_tokens_masked(result["trajectory"])


def test_an_unknown_environment_fails_in_init_naming_it_and_the_known_ones(env_server):
    result = process(env_server, count_task(env_class="no_such_env"))

    assert result["status"] == "failed"
    assert result["error"]["stage"] == "init" and result["error"]["type"] == "UnknownEnvironment"
    assert "'no_such_env'" in result["error"]["message"] and "gsm8k_multi_turn" in result["error"]["message"]


@pytest.mark.parametrize(
    ("behaviour", "stage", "kind", "message"),
    [
        ("raise_make", "init", "EnvironmentFailed", "'prorl_test_count' make raised RuntimeError: no database"),
        (
            "raise_init",
            "init",
            "EnvironmentFailed",
            "'prorl_test_count' init raised RuntimeError: cannot load the task",
        ),
        ("bad_init", "init", "MalformedObservation", "init output: expected a list of chat messages, got str"),
        ("raise_step", "run", "EnvironmentFailed", "'prorl_test_count' step 2 raised ValueError: the grader crashed"),
        (
            "text_observation",
            "run",
            "MalformedObservation",
            "step 2 output: observations: Input should be a valid list",
        ),
        ("assistant_observation", "run", "MalformedObservation", "step 2 output: observations.0.role"),
        ("bad_reward", "run", "MalformedObservation", "step 2 output: reward"),
        ("no_done", "run", "MalformedObservation", "step 2 output: done: Field required"),
        ("not_a_dict", "run", "MalformedObservation", "step 2 output"),
    ],
)
def test_a_misbehaving_environment_fails_its_job_naming_the_env_and_the_call(
    env_server, backend, behaviour, stage, kind, message
):
    backend.double.push("one", "two", "three")
    result = process(env_server, count_task(behaviour=behaviour, at=2))

    assert result["status"] == "failed", result
    assert result["error"]["stage"] == stage and result["error"]["type"] == kind
    assert message in result["error"]["message"]
    if stage == "run":
        assert len(result["trajectory"]["turns"]) == 2  # the turns before the failure are kept
        assert_model_tokens_masked(result["trajectory"])


def test_a_step_past_its_timeout_fails_the_job_at_once(env_server, backend):
    backend.double.push("one")
    started = time.monotonic()
    result = process(env_server, count_task(behaviour="slow", at=1, step_timeout=0.3))

    assert result["status"] == "failed"
    assert result["error"]["type"] == "EnvironmentFailed"
    assert "'prorl_test_count' step 1: no answer within 0.3 s" in result["error"]["message"]
    assert time.monotonic() - started < 1.8


@pytest.mark.parametrize(
    ("instance", "field"),
    [
        ({"data_source": "skyrl_gym", "prompt": "hi"}, "env_class"),
        ({"data_source": "skyrl_gym", "env_class": "gsm8k"}, "prompt"),
        (count_task(prompt=[{"role": "robot", "content": "hi"}]), "prompt"),
        (count_task(max_turns=10_000), "max_turns"),
    ],
)
def test_an_instance_of_the_wrong_shape_is_refused_at_submission(env_server, instance, field):
    response = env_server.http.post("/process", json={"instance": instance, "timeout": 30})

    assert response.status_code == 400
    assert field in response.json()["detail"]


def test_without_skyrl_gym_installed_the_failure_says_how_to_install_it(monkeypatch):
    from prorl_handlers.env_adapters import EnvAdapterError
    from prorl_handlers.skyrl_gym.handler import make_env

    monkeypatch.setitem(sys.modules, "skyrl_gym", None)  # `import skyrl_gym` raises ImportError
    with pytest.raises(EnvAdapterError, match=r"pip install 'prorl-server\[environments\]'"):
        make_env("gsm8k", {}, {})
