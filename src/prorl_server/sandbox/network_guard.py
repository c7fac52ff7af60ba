"""NetworkGuard: what a sandbox sharing the host network (modes `host`, `loopback`) may not connect to.

Such a sandbox could otherwise reach the rollout server's own HTTP API and the LLM backends (and, through a
backend, other jobs' prompts). The guard knows their TCP ports (the API's from the settings, the backends'
from the live backend pool, read at each sandbox start) and hands the runtime a Landlock ruleset that denies
connecting to them (landlock.py); a handler that wants its sandbox to reach them says so in the spec
(`allow_api`, `allow_llm_backends`). The LLM judge's ports (`--judge-server`) are always denied: the policy
must not be able to ask the judge that scores it; a judge on the web's own ports (80, 443) is left reachable,
since denying those would cut sandboxes off from the web, and such (hosted) judges need the API key the
sandbox never has. Ports are denied on every address: a sandbox cannot connect to port 8000 of anything while
the API listens on 8000. A backend registered after a sandbox started is not denied
to that sandbox. Where the kernel has no Landlock network rules (before Linux 6.7) the guard logs one loud
warning and lets such sandboxes start unguarded.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from prorl_server.sandbox import landlock
from prorl_server.sandbox.spec import SandboxSpec

log = logging.getLogger(__name__)

WEB_PORTS = frozenset({80, 443})
"""Judge ports never denied (see the module docstring)."""


def url_port(address: str) -> int | None:
    """The TCP port of an http(s) URL (its scheme's default if none), None if it has none."""
    try:
        parts = urlsplit(address)
        return parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return None


class NetworkGuard:
    """The ports sandboxes sharing the host network may not connect to, as Landlock rulesets."""

    def __init__(
        self,
        api_ports: Iterable[int] = (),
        backend_ports: Callable[[], Iterable[int]] = tuple,
        judge_ports: Iterable[int] = (),
    ) -> None:
        self.api_ports = frozenset(api_ports)
        self.backend_ports = backend_ports
        self.judge_ports = frozenset(port for port in judge_ports if port not in WEB_PORTS)
        self._rulesets = landlock.RulesetCache()
        self._warned = False
        self._lock = threading.Lock()

    def denied_ports(self, spec: SandboxSpec) -> frozenset[int]:
        """The ports `spec`'s sandbox may not connect to (none in its own network namespace)."""
        if spec.network == "none":
            return frozenset()
        denied = set(self.judge_ports) if spec.allow_api else set(self.api_ports | self.judge_ports)
        if not spec.allow_llm_backends:
            denied.update(self.backend_ports())
        return frozenset(denied)

    def ruleset_fd(self, spec: SandboxSpec) -> int | None:
        """A Landlock ruleset fd for `spec` (owned by the guard; may block ~0.1 s the first time for a set of
        ports), or None when there is nothing to deny or no Landlock to deny it with."""
        denied = self.denied_ports(spec)
        if not denied:
            return None
        reason = self._unavailable
        if reason is not None:
            with self._lock:
                warn, self._warned = not self._warned, True
            if warn:
                log.warning(
                    "sandboxes with network=%s can reach this server's API and the LLM backends (ports %s): %s",
                    spec.network,
                    sorted(denied),
                    reason,
                )
            return None
        return self._rulesets.fd_for(denied)

    @functools.cached_property
    def _unavailable(self) -> str | None:
        """Why this kernel cannot enforce the rulesets (asked once), or None."""
        return landlock.unavailable_reason()

    def close(self) -> None:
        """Close the rulesets (call when no sandbox is starting); they are built again when needed."""
        self._rulesets.close()
