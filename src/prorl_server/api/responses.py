"""Fast JSON responses for pydantic models (serialized once, by pydantic-core)."""

from __future__ import annotations

from fastapi import Response
from pydantic import BaseModel


def model_response(model: BaseModel, status_code: int = 200) -> Response:
    """Serialize `model` straight to JSON bytes, skipping FastAPI's re-validation."""
    return Response(model.model_dump_json(), status_code=status_code, media_type="application/json")
