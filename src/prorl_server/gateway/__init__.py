"""The OpenAI-compatible gateway: any harness that speaks OpenAI's Chat Completions API reaches the policy
through a session, and every completion is recorded token-exact (docs/gateway.md).

Laid out as vLLM's entrypoints are: `protocol` (wire models), `serving` (request to answer), `router` (thin
routes), with `sessions` (the open sessions: keys, bounds, closing, the close answer), `recorder` (the
token-exact segments of each chain), `chains` (which chain, and which segment of it, a call joins),
`messages` (a harness's messages as the template and the comparison see them) and `errors` (OpenAI's error
shape). This package imports no handler code, so `JobContext` can open sessions.
"""

from prorl_server.gateway.bridge import SessionBridge
from prorl_server.gateway.sandbox_access import PLACEHOLDER_KEY, check_spec, gateway_env, sandbox_spec, start_relay
from prorl_server.gateway.sessions import CallObserver, GatewayLimits, SessionRegistry

__all__ = [
    "PLACEHOLDER_KEY",
    "CallObserver",
    "GatewayLimits",
    "SessionBridge",
    "SessionRegistry",
    "check_spec",
    "gateway_env",
    "sandbox_spec",
    "start_relay",
]
