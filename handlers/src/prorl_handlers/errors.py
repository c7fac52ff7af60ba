"""BundledHandlerError: the root of the bundled handlers' own errors, a ProrlError (see prorl_server.errors)."""

from __future__ import annotations

from prorl_server.errors import ProrlError


class BundledHandlerError(ProrlError):
    """A bundled handler's own failure: a harness that is not installed, a repository or task it cannot use."""
