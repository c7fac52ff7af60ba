"""`prorl-server profile-backend` against the dev engine, and the profile file it writes (read by the
presorted_dp placement and sim-llm)."""

from __future__ import annotations

import asyncio
import json

import pytest
from repo_paths import EXAMPLES

from prorl_server.backend_profiler import ProfilerSettings, ProfilingError, measure
from prorl_server.llm.placement import interference_profile
from prorl_server.scheduling.profile_file import FORMAT, MAX_FILE_BYTES, read_profile_file
from prorl_server.simllm import SimLLMServer
from prorl_server.simllm.config import SimLLMSettings

pytest_plugins = ("devllm_fixtures",)

EXAMPLES = EXAMPLES / "profiles"


def test_measures_the_dev_engine_and_the_file_feeds_placement_and_the_simulator(dev_llm, tmp_path):
    # 2 against 24 tokens, median of 3: on a loaded machine 2 against 10 once read as "no longer" (0.43 s vs 0.45 s)
    settings = ProfilerSettings(
        url=dev_llm.address, batch_sizes=(1, 2), short_tokens=2, long_tokens=24, prefill_tokens=(16, 64), repeats=3
    )
    lines: list[str] = []
    result = asyncio.run(measure(settings, progress=lines.append))
    assert [batch for batch, _ in result.points] == [1, 2]
    assert all(seconds > 0 for _, seconds in result.points)
    assert result.prefill_s_per_token is not None and result.prefill_s_per_token >= 0
    assert result.model == "SmolLM2-135M-Instruct"
    assert len(lines) == 3
    path = tmp_path / "dev.json"
    path.write_text(result.model_dump_json())
    assert read_profile_file(path) == result
    assert interference_profile(str(path)).seconds == tuple(s for _, s in result.points)
    assert SimLLMSettings(profile=str(path)).profile.points == result.points


def test_a_refused_request_stops_the_measurement():
    # prompt + max_tokens past the simulator's context length: it answers 400, as vLLM does
    with SimLLMServer(time_scale=1000, max_model_len=64) as sim:
        settings = ProfilerSettings(
            url=sim.address, batch_sizes=(1,), prompt_tokens=8, short_tokens=2, long_tokens=100, repeats=1
        )
        with pytest.raises(ProfilingError, match="HTTP 400"):
            asyncio.run(measure(settings))


def test_an_unreachable_backend_is_a_clear_error():
    settings = ProfilerSettings(url="http://127.0.0.1:9/v1", batch_sizes=(1,), repeats=1, timeout_s=5)
    with pytest.raises(ProfilingError, match="/v1/models"):
        asyncio.run(measure(settings))


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.json")))
def test_the_shipped_profiles_are_valid(name):
    profile = read_profile_file(EXAMPLES / name)
    assert profile.profile().nondecreasing
    assert profile.prefill_s_per_token is not None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not a prorl-server-profile/1"),
        (json.dumps({"format": FORMAT, "points": []}), "at least 1"),
        (json.dumps({"format": FORMAT, "points": [[4, 0.1], [2, 0.2]]}), "strictly increasing"),
        (json.dumps({"format": FORMAT, "points": [[1, -0.1]]}), "finite"),
        (json.dumps({"format": FORMAT, "points": [[1, 0.1]], "extra": 1}), "extra"),
        (json.dumps({"format": "other", "points": [[1, 0.1]]}), "format"),
        ("x" * (MAX_FILE_BYTES + 1), "larger than"),
    ],
)
def test_a_bad_profile_file_is_refused_with_its_name(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as caught:
        read_profile_file(path)
    assert str(path) in str(caught.value)
