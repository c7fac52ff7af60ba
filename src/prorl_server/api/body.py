"""Lean request-body parsing for the hot routes (`/process`, `/jobs`).

FastAPI's body and dependency machinery costs more per request than the whole job pipeline for a short
job; these routes read the raw body and let pydantic-core validate it in one call. Errors keep FastAPI's
422 shape (`{"detail": [{"loc": ["body", ...], "msg", "type"}]}`).
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


async def parse_body(request: Request, model: type[M]) -> M:
    """Validate the JSON body as `model`, raising FastAPI's RequestValidationError (HTTP 422)."""
    raw = await request.body()
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = [_jsonable(err) for err in exc.errors(include_url=False)]
        raise RequestValidationError(errors, body=raw.decode(errors="replace")) from None


def _jsonable(error: dict[str, Any]) -> dict[str, Any]:
    """Prefix the location with "body"; raw input bytes (invalid UTF-8 included) become text."""
    error = {**error, "loc": ("body", *error["loc"])}
    if isinstance(error.get("input"), bytes):
        error["input"] = error["input"].decode(errors="replace")
    return error


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` documenting `model` as the JSON request body of a route that parses it itself."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}
