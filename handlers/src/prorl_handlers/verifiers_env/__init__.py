"""A `verifiers` (0.4, `verifiers.v1`) environment as a prorl-server handler (docs/environments.md).

Imports no verifiers: the handler imports it when a job needs it, so the handlers load (and fail such jobs
with a message saying how to install it) where it is not installed.
"""

from prorl_handlers.verifiers_env.handler import VerifiersHandler, VerifiersTask

__all__ = ["VerifiersHandler", "VerifiersTask"]
