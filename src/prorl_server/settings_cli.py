"""The `serve` flags, generated from ServerSettings: one flag per field, its help text the field's description.

A field `foo_bar_s` becomes `--foo-bar` (the `_s` unit suffix dropped: its metavar says SECONDS); the type,
choices, bounds and default come from the field, so a bad value is an argparse error naming the flag.
"""

from __future__ import annotations

import argparse
import os
import types
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from prorl_server.config import ServerSettings
from prorl_server.protocol import API_KEY_ENV

GROUPS: dict[str, tuple[str, ...]] = {
    "server": ("host", "port", "api_key", "no_api_key", "max_body_bytes", "autostart", "log_level"),
    "pipeline": (
        "init_workers",
        "run_workers",
        "eval_workers",
        "max_ready_for_run",
        "default_timeout_s",
        "result_retention_s",
        "cancel_grace_s",
        "group_refill_attempts",
        "group_max_refills",
    ),
    "results journal": ("journal", "journal_sync", "journal_compact_interval_s"),
    "handlers and sandboxes": ("handlers", "entry_point_handlers", "runtime", "sandbox_image", "sandbox_dir"),
    "action scheduler": ("action_scheduler", "action_cpus", "action_cpu_reserve", "action_idle_cpus"),
    "LLM backends": (
        "llm_servers",
        "placement",
        "health_check_interval_s",
        "llm_request_timeout_s",
        "llm_max_failovers",
        "llm_retry_budget_s",
        "llm_failure_threshold",
        "llm_breaker_cooldown_s",
        "llm_stall_timeout_s",
        "tokenizer",
        "tool_call_format",
    ),
    "LLM judge": (
        "judge_servers",
        "judge_model",
        "judge_timeout_s",
        "judge_retry_budget_s",
        "judge_max_concurrency",
        "judge_rate",
    ),
    "external services": ("service_quotas", "model_services", "model_service_budget_mb"),
    "weight updates": ("max_staleness", "stale_policy", "weight_pause_lease_s"),
    "scheduling": (
        "dispatch_policy",
        "predictor",
        "max_inflight_per_backend",
        "vllm_priority",
        "interference_profile",
        "backend_profiles",
        "migration_prefill_s_per_token",
    ),
    "OpenAI gateway": (
        "gateway_url",
        "gateway_max_sessions",
        "gateway_idle_timeout_s",
        "gateway_max_segments",
        "gateway_max_chains",
        "gateway_max_messages",
        "gateway_max_body_bytes",
    ),
}
"""Sections of `serve --help`; every ServerSettings field is in exactly one."""

ALIASES: dict[str, tuple[str, ...]] = {
    "sandbox_image": ("--image",),
    "llm_servers": ("--llm-server",),
    "judge_servers": ("--judge-server",),
    "backend_profiles": ("--backend-profile",),
    "service_quotas": ("--service-quota",),
    "model_services": ("--model-service",),
    "handlers": ("--handler",),
    "entry_point_handlers": ("--entry-points",),  # and so --no-entry-points
    "default_timeout_s": ("--timeout",),
    "result_retention_s": ("--retention",),
    "health_check_interval_s": ("--health-interval",),
    "llm_request_timeout_s": ("--llm-timeout",),
}
"""Spellings the flags had before they were generated; they stay valid (not deprecated)."""

METAVARS: dict[str, str] = {
    "host": "ADDRESS",
    "port": "PORT",
    "api_key": "KEY",
    "max_body_bytes": "BYTES",
    "gateway_max_body_bytes": "BYTES",
    "gateway_url": "URL",
    "sandbox_image": "IMAGE",
    "sandbox_dir": "DIR",
    "llm_servers": "URL",
    "judge_servers": "URL",
    "judge_model": "MODEL",
    "judge_rate": "PER_SECOND",
    "service_quotas": "NAME=MAX[/RATE]",
    "model_services": "NAME=MEMORY_MB",
    "model_service_budget_mb": "MIB",
    "action_cpu_reserve": "CORES",
    "action_cpus": "LIST",
    "action_idle_cpus": "CORES",
    "handlers": "[NAME=]MODULE:CLASS",
    "journal": "PATH",
    "backend_profiles": "ADDRESS=PROFILE",
}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default unless it is None or empty (the help text then says what unset means)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default == []:
            return action.help
        return super()._get_help_string(action)


def flag_name(field: str) -> str:
    """The flag of a ServerSettings field: `--field-name`, without a trailing `_s` (seconds)."""
    return "--" + field.removesuffix("_s").replace("_", "-")


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per ServerSettings field (dest = the field's name), in the sections of GROUPS."""
    fields = ServerSettings.model_fields
    grouped = [name for names in GROUPS.values() for name in names]
    if sorted(grouped) != sorted(fields):
        wrong = sorted({n for n in grouped if n not in fields or grouped.count(n) > 1} | (fields.keys() - grouped))
        raise RuntimeError(f"settings_cli.GROUPS must list each ServerSettings field once; check {wrong}")
    for title, names in GROUPS.items():
        group = parser.add_argument_group(title)
        for name in names:
            add_field_argument(group, name, fields[name])


def add_field_argument(group: argparse._ActionsContainer, name: str, field: FieldInfo) -> None:
    """The flag of one field: its spellings, and a type, choices or action from the field's annotation."""
    flags = [flag_name(name), *ALIASES.get(name, ())]
    default = field.get_default(call_default_factory=True)
    options: dict[str, Any] = {"dest": name, "default": default, "help": (field.description or "").replace("%", "%%")}
    annotation = _without_none(field.annotation)
    if annotation is bool:  # --flag/--no-flag; a flag that already says no (--no-api-key) is a plain switch
        action = "store_true" if flags[0].startswith("--no-") else argparse.BooleanOptionalAction
        group.add_argument(*flags, action=action, **options)
        return
    if get_origin(annotation) is Literal:
        options["choices"] = get_args(annotation)
    elif get_origin(annotation) is list:
        (item,) = get_args(annotation)
        options.update(action="append", type=_converter(item, []))
    else:
        options["type"] = _converter(annotation, field.metadata)
    metavar = METAVARS.get(name) or ("SECONDS" if name.endswith("_s") else "N" if annotation is int else None)
    if metavar is not None and "choices" not in options:
        options["metavar"] = metavar
    group.add_argument(*flags, **options)


def _without_none(annotation: Any) -> Any:
    """`X` of `X | None`; any other annotation as it is."""
    if get_origin(annotation) in (Union, types.UnionType):
        (inner,) = (arg for arg in get_args(annotation) if arg is not type(None))
        return inner
    return annotation


def _converter(annotation: Any, metadata: list[Any]) -> Callable[[str], Any]:
    """Text -> value, checked against the field's bounds; a bad one raises ArgumentTypeError (argparse
    then names the flag)."""
    adapter: TypeAdapter[Any] = TypeAdapter(Annotated[annotation, *metadata] if metadata else annotation)

    def convert(text: str) -> Any:
        try:
            return adapter.validate_python(text)
        except ValidationError as exc:
            message = exc.errors()[0]["msg"]
            raise argparse.ArgumentTypeError(f"{message[:1].lower()}{message[1:]}, got {text!r}") from None

    return convert


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """Parsed `serve` flags -> ServerSettings; without --api-key, the key comes from $PRORL_API_KEY (the key
    file is `serve`'s business). ValueError for --no-api-key together with a key."""
    values = {name: getattr(args, name) for name in ServerSettings.model_fields}
    values["api_key"] = values["api_key"] or os.environ.get(API_KEY_ENV) or None
    if values["no_api_key"] and values["api_key"] is not None:
        given = "--api-key" if args.api_key else f"${API_KEY_ENV}"
        raise ValueError(f"--no-api-key serves without a key, but a key is given ({given}): drop one of them")
    return ServerSettings(**values)
