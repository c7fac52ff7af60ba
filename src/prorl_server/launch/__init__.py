"""Launchers: `LocalStack` runs an LLM engine and a prorl-server as child processes on this machine."""

from prorl_server.auth_key import auth_headers
from prorl_server.launch.local_stack import LocalStack, free_port, run_with_stack

__all__ = ["LocalStack", "auth_headers", "free_port", "run_with_stack"]
