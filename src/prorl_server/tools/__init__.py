"""Deprecated alias of `prorl_server.tool_server` (the in-sandbox execution server and its host client), kept
for one release for handler code that imports `prorl_server.tools.client` or `prorl_server.tools.errors`
(docs/handlers.md named them). Import from `prorl_server.tool_server` instead.

`prorl_server.tools.client`, `.errors`, `.files` and `.protocol` are the very modules of `tool_server`.
"""

from __future__ import annotations

import importlib
import sys

for _name in ("client", "errors", "files", "protocol"):
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"prorl_server.tool_server.{_name}")
