"""Request-body parsing for every route that takes a JSON body.

FastAPI's body and dependency machinery costs more per request than the whole job pipeline for a short
job; these routes read the raw body, parse it with pydantic-core and validate it in one call. Errors keep
FastAPI's 422 shape (`{"detail": [{"loc": ["body", ...], "msg", "type"}]}`).

The work a hostile body can cause stays bounded: the body size is limited by BodyLimitMiddleware, and
unknown top-level fields are rejected before validation (a body of a million unknown fields would
otherwise cost a million validation errors, each holding its input, while the event loop waits).

A leaf module, below both the API's routers and the gateway's.
"""

from __future__ import annotations

from functools import cache
from itertools import islice
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from pydantic_core import from_json

M = TypeVar("M", bound=BaseModel)

MAX_ERRORS = 20
"""Validation errors reported per request; a note replaces the rest (api/errors.py shortens a 422 to it)."""


async def parse_body(request: Request, model: type[M]) -> M:
    """Validate the JSON body as `model`, raising FastAPI's RequestValidationError (HTTP 422)."""
    raw = await request.body()
    try:
        data = from_json(raw, cache_strings=False)  # a cache only slows bodies of many distinct strings
    except ValueError as exc:
        raise RequestValidationError(
            [{"type": "json_invalid", "loc": ("body",), "msg": f"Invalid JSON: {exc}"}]
        ) from None
    if isinstance(data, dict) and model.model_config.get("extra") == "forbid":
        _reject_unknown_fields(data, _field_names(model))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in exc.errors(include_url=False, include_context=False)]
        raise RequestValidationError(errors) from None


def _reject_unknown_fields(data: dict[str, Any], known: frozenset[str]) -> None:
    """Fail naming the first unknown fields (one more than the 422 shows, so it notes that there are others);
    the scan stops there and builds nothing for the rest."""
    unknown = list(islice((key for key in data if key not in known), MAX_ERRORS + 1))
    if unknown:
        raise RequestValidationError(
            [
                {"type": "extra_forbidden", "loc": ("body", key), "msg": "Extra inputs are not permitted"}
                for key in unknown
            ]
        )


@cache
def _field_names(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(field.alias or name for name, field in model.model_fields.items())


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` documenting `model` as the JSON request body of a route that parses it itself."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}
