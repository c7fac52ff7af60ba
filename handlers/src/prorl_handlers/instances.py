"""Instance validation shared by the handlers: a pydantic model per task, errors that name the fields."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def parse_instance(model: type[M], instance: dict[str, Any]) -> M:
    """`instance` as `model`, else a ValueError naming every bad field (raised in INIT, it fails the job)."""
    try:
        return model.model_validate(instance)
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'instance'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"invalid {instance.get('data_source')} instance: {fields}") from None
