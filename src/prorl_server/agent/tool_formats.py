"""The tool-call formats, kept importable here: they live in the leaf package `prorl_server.tool_formats`,
which the gateway shares with the agent loop (the same objects: a format added to `FORMATS` here is added
there)."""

from prorl_server.tool_formats import (
    FORMATS,
    HERMES,
    MalformedCall,
    Parsed,
    ToolCall,
    ToolCallFormat,
    ToolSchemas,
    backend_format,
    detect_format,
    keep_call_markers,
    tool_format,
)

__all__ = [
    "FORMATS",
    "HERMES",
    "MalformedCall",
    "Parsed",
    "ToolCall",
    "ToolCallFormat",
    "ToolSchemas",
    "backend_format",
    "detect_format",
    "keep_call_markers",
    "tool_format",
]
