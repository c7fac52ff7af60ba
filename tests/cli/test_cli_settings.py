"""The `serve` flags are generated from ServerSettings: every field has one, typed, bounded and documented."""

from __future__ import annotations

import argparse
import re
import types
import warnings
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest
from repo_paths import REPO

from prorl_server import settings_cli
from prorl_server.cli import build_parser, settings_from_args
from prorl_server.config import RUNTIME_NAMES, PlacementName, ServerSettings
from prorl_server.llm.placement import POLICIES
from prorl_server.protocol.server import API_KEY_ENV
from prorl_server.sandbox import registry
from prorl_server.settings_cli import ALIASES, flag_name

README = REPO / "README.md"
FIELDS = ServerSettings.model_fields

# Every `serve` flag before the flags were generated (cli.py, before issue 11).
OLD_FLAGS = [
    "--host", "--port", "--init-workers", "--run-workers", "--eval-workers", "--max-ready-for-run", "--llm-server",
    "--handler", "--runtime", "--image", "--no-entry-points", "--placement", "--timeout", "--retention",
    "--health-interval", "--llm-timeout", "--cancel-grace", "--llm-retry-budget", "--llm-failure-threshold",
    "--llm-breaker-cooldown", "--llm-max-failovers", "--llm-stall-timeout", "--max-staleness", "--stale-policy",
    "--api-key", "--max-body-bytes", "--no-autostart", "--log-level",
]  # fmt: skip


@pytest.fixture(autouse=True)
def no_key_in_environment(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)


def serve_parser() -> argparse.ArgumentParser:
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices["serve"]


def serve_actions() -> dict[str, argparse.Action]:
    return {a.dest: a for a in serve_parser()._actions if a.dest != "help"}


def parse(*argv: str) -> ServerSettings:
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


WELL_FORMED: dict[str, Any] = {
    "service_quotas": ("search=8/20", "maps=2"),
    "model_services": ("judge-a=450", "judge-b=300"),
    "action_cpus": "0",
    "group_max_refills": 100,
}
"""Sample values of the fields whose values are checked for form or bounded below the usual sample."""


def sample(name: str) -> tuple[list[str], Any]:
    """Flag arguments that set field `name` to something other than its default, and that value."""
    field = FIELDS[name]
    annotation = field.annotation
    if get_origin(annotation) is types.UnionType:  # X | None
        (annotation,) = (a for a in get_args(annotation) if a is not type(None))
    flag = flag_name(name)
    if annotation is bool:
        return ([f"--no-{flag[2:]}"] if field.default else [flag]), not field.default
    if get_origin(annotation) is Literal:
        choice = next(c for c in get_args(annotation) if c != field.default)
        return [flag, choice], choice
    if get_origin(annotation) is list:
        one, two = WELL_FORMED.get(name, ("a", "b"))
        return [flag, one, flag, two], [one, two]
    value = WELL_FORMED.get(name, {int: 2048, float: 7.5, str: "sample", Path: Path("/scratch/local")}[annotation])
    assert value != field.default
    return [flag, str(value)], value


def test_every_setting_has_a_flag_with_its_description_as_help():
    actions = serve_actions()
    assert set(actions) == set(FIELDS)
    for name, field in FIELDS.items():
        assert field.description, f"ServerSettings.{name} has no description"
        assert actions[name].help.startswith(field.description), name
        assert flag_name(name) in actions[name].option_strings


def test_llm_max_failovers_has_its_flag():
    assert parse("--llm-max-failovers", "0").llm_max_failovers == 0


@pytest.mark.parametrize("name", list(FIELDS))
def test_each_flag_sets_its_field_and_only_it(name):
    argv, expected = sample(name)
    settings = parse(*argv)
    assert getattr(settings, name) == expected
    defaults = ServerSettings()
    assert {n: getattr(settings, n) for n in FIELDS if n != name} == {
        n: getattr(defaults, n) for n in FIELDS if n != name
    }


def test_no_flags_give_the_default_settings():
    assert parse() == ServerSettings()


def test_old_spellings_still_parse_to_the_same_settings_without_warnings():
    assert set(OLD_FLAGS) <= {s for a in serve_parser()._actions for s in a.option_strings}
    old = [
        "--host", "0.0.0.0", "--port", "9001", "--init-workers", "2", "--run-workers", "3", "--eval-workers", "4",
        "--max-ready-for-run", "5", "--llm-server", "http://a/v1", "--llm-server", "http://b/v1",
        "--handler", "x=m:C", "--runtime", "local", "--image", "img.sif", "--no-entry-points",
        "--placement", "min_heap", "--timeout", "11", "--retention", "12", "--health-interval", "13",
        "--llm-timeout", "14", "--cancel-grace", "0", "--llm-retry-budget", "16", "--llm-failure-threshold", "17",
        "--llm-breaker-cooldown", "18", "--llm-max-failovers", "19", "--llm-stall-timeout", "20",
        "--max-staleness", "0", "--stale-policy", "continue", "--api-key", "k", "--max-body-bytes", "4096",
        "--no-autostart", "--log-level", "debug",
    ]  # fmt: skip
    assert set(OLD_FLAGS) == {a for a in old if a.startswith("--")}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settings = parse(*old)
    assert settings == ServerSettings(
        host="0.0.0.0",
        port=9001,
        init_workers=2,
        run_workers=3,
        eval_workers=4,
        max_ready_for_run=5,
        llm_servers=["http://a/v1", "http://b/v1"],
        handlers=["x=m:C"],
        runtime="local",
        sandbox_image="img.sif",
        entry_point_handlers=False,
        placement="min_heap",
        default_timeout_s=11.0,
        result_retention_s=12.0,
        health_check_interval_s=13.0,
        llm_request_timeout_s=14.0,
        cancel_grace_s=0.0,
        llm_retry_budget_s=16.0,
        llm_failure_threshold=17,
        llm_breaker_cooldown_s=18.0,
        llm_max_failovers=19,
        llm_stall_timeout_s=20.0,
        max_staleness=0,
        stale_policy="continue",
        api_key="k",
        max_body_bytes=4096,
        autostart=False,
        log_level="debug",
    )


def test_an_old_and_a_new_spelling_append_to_the_same_list():
    assert parse("--llm-server", "http://a/v1", "--llm-servers", "http://b/v1").llm_servers == [
        "http://a/v1",
        "http://b/v1",
    ]


@pytest.mark.parametrize(
    ("argv", "named", "says"),
    [
        (["--max-staleness", "-1"], "--max-staleness", "greater than or equal to 0"),
        (["--cancel-grace", "-0.5"], "--cancel-grace", "greater than or equal to 0"),
        (["--init-workers", "0"], "--init-workers", "greater than or equal to 1"),
        (["--port", "70000"], "--port", "less than or equal to 65535"),
        (["--timeout", "0"], "--default-timeout/--timeout", "greater than 0"),
        (["--max-body-bytes", "10"], "--max-body-bytes", "greater than or equal to 1024"),
        (["--run-workers", "x"], "--run-workers", "valid integer"),
        (["--llm-retry-budget", "soon"], "--llm-retry-budget", "valid number"),
        (["--api-key", ""], "--api-key", "at least 1 character"),
        (["--runtime", "docker"], "--runtime", "invalid choice: 'docker'"),
        (["--placement", "random"], "--placement", "invalid choice: 'random'"),
        (["--log-level", "loud"], "--log-level", "invalid choice: 'loud'"),
    ],
)
def test_a_bad_value_is_an_argparse_error_naming_the_flag(argv, named, says, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", *argv])
    assert exited.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith(f"prorl-server serve: error: argument {named}: "), error
    assert says in error, error


def test_runtime_and_placement_names_are_declared_once():
    actions = serve_actions()
    assert tuple(actions["runtime"].choices) == RUNTIME_NAMES == registry.CHOICES
    assert tuple(actions["placement"].choices) == get_args(PlacementName)
    assert set(registry.RUNTIMES) == set(RUNTIME_NAMES) - {"auto"} == {*registry.AUTO_ORDER, "podman"}
    assert set(POLICIES) == set(get_args(PlacementName))
    assert get_args(FIELDS["runtime"].annotation) == RUNTIME_NAMES
    assert get_args(FIELDS["placement"].annotation) == get_args(PlacementName)


def test_the_api_key_comes_from_the_environment_unless_given(monkeypatch):
    assert parse().api_key is None
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert parse().api_key == "from-env"
    assert parse("--api-key", "from-flag").api_key == "from-flag"


def test_no_api_key_is_a_plain_switch():
    spellings = {s for a in serve_parser()._actions for s in a.option_strings}
    assert "--no-api-key" in spellings and "--no-no-api-key" not in spellings
    assert parse("--no-api-key").no_api_key and not parse().no_api_key


def test_a_field_left_out_of_the_help_sections_is_caught(monkeypatch):
    groups = dict(settings_cli.GROUPS)
    groups["weight updates"] = ("max_staleness",)
    monkeypatch.setattr(settings_cli, "GROUPS", groups)
    with pytest.raises(RuntimeError, match="GROUPS"):
        build_parser()


def test_help_is_grouped_and_shows_defaults_but_not_none():
    text = serve_parser().format_help()
    for title in settings_cli.GROUPS:
        assert f"\n{title}:\n" in text
    text = " ".join(text.split())
    assert "(default: 64)" in text and "(default: sticky_least_loaded)" in text
    assert "(default: None)" not in text and "(default: [])" not in text


def test_readme_lists_every_serve_flag():
    section = README.read_text().split("## Running a server", 1)[1].split("\n\n|", 1)[1].split("\n\n", 1)[0]
    first_cells = [row.split("|")[1] for row in ("|" + section).splitlines()[2:]]
    listed = {flag for cell in first_cells for flag in re.findall(r"--[a-z][a-z-]*", cell)}
    spellings = {s for a in serve_parser()._actions for s in a.option_strings}
    assert listed <= spellings, listed - spellings
    for name in FIELDS:
        flags = [flag_name(name), *ALIASES.get(name, ())]
        for flag in flags:
            assert {flag, f"--no-{flag[2:]}"} & listed, f"README's flag table does not list {flag}"
