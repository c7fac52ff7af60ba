"""HTTP API: the app factory; routers are thin, logic lives in `prorl_server.pipeline`."""

from prorl_server.api.app import create_app
from prorl_server.api.state import ServerState

__all__ = ["ServerState", "create_app"]
