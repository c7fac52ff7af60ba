"""A gateway session inside a sandbox without network: its bridge's socket bound in, relayed on loopback.

`sandbox_spec()` adds to a sandbox's spec the bind of a `SessionBridge`'s socket (at SANDBOX_SOCKET) and
the variables an OpenAI client reads (`OPENAI_BASE_URL=http://127.0.0.1:SANDBOX_PORT/v1`, `OPENAI_API_KEY`
a placeholder, since the bridge sends the session's key itself, and `OPENAI_MODEL`) and their Anthropic
counterparts (`ANTHROPIC_BASE_URL=http://127.0.0.1:SANDBOX_PORT`, without `/v1`: Anthropic's clients add
`/v1/messages`; `ANTHROPIC_API_KEY`, the same placeholder; `ANTHROPIC_MODEL`); once the sandbox is up,
`start_relay()` has its execution server listen on that port (tool_server/relay.py). Every process of the
sandbox then reaches its own session, and only it: the bridge on the host fixes the session and refuses
every other path. `JobContext.start_sandbox(spec, gateway=access)` does all of it (docs/gateway.md, "From
inside a sandbox").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prorl_server.sandbox import Bind, Sandbox, SandboxError, SandboxSpec

if TYPE_CHECKING:
    from prorl_server.gateway.bridge import SessionBridge

SANDBOX_SOCKET = "/run/prorl/gateway.sock"
SANDBOX_PORT = 8642
PLACEHOLDER_KEY = "sk-prorl-sandbox"
"""The sandbox's `OPENAI_API_KEY` and `ANTHROPIC_API_KEY`: clients want one; the bridge sends the session's."""


def gateway_env(model: str) -> dict[str, str]:
    """The variables that point an OpenAI or Anthropic client in the sandbox at its session."""
    address = f"http://127.0.0.1:{SANDBOX_PORT}"
    return {
        "OPENAI_BASE_URL": f"{address}/v1",
        "OPENAI_API_KEY": PLACEHOLDER_KEY,
        "OPENAI_MODEL": model,
        "ANTHROPIC_BASE_URL": address,
        "ANTHROPIC_API_KEY": PLACEHOLDER_KEY,
        "ANTHROPIC_MODEL": model,
    }


def check_spec(spec: SandboxSpec) -> None:
    """SandboxError unless a relay can serve `spec`'s sandbox: no network of the host's, an execution server."""
    if spec.network != "none":
        raise SandboxError(
            f"the gateway is relayed into sandboxes with network 'none' only (this one has {spec.network!r}); a "
            "sandbox sharing the host network reaches the session's base_url directly (with allow_api=True)"
        )
    if not spec.tools:
        raise SandboxError("the gateway is relayed by the sandbox's execution server: the spec needs tools=True")


def sandbox_spec(spec: SandboxSpec, bridge: SessionBridge, model: str) -> SandboxSpec:
    """`spec` with the bridge's socket bound in and the gateway's variables set (checked with `check_spec`).

    Unless the spec says otherwise, its CPU is `static`: the harness inside runs its own commands between
    model calls, which the server's action scheduler cannot see (docs/sandboxes.md, "CPU per action")."""
    check_spec(spec)
    bind = Bind(source=str(bridge.socket_path), target=SANDBOX_SOCKET, read_only=True)
    env = {**spec.env, **gateway_env(model)}
    update: dict[str, object] = {"binds": [*spec.binds, bind], "env": env}
    if "cpu_grants" not in spec.model_fields_set:
        update["cpu_grants"] = "static"
    return spec.model_copy(update=update)


async def start_relay(sandbox: Sandbox) -> None:
    """Have the sandbox's execution server relay SANDBOX_PORT on its loopback to the bound socket."""
    await sandbox.tools.gateway_relay(SANDBOX_SOCKET, SANDBOX_PORT)
