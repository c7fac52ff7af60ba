"""Launchers: `LocalStack` runs an LLM engine and a prorl-server as child processes on this machine."""

from prorl_server.auth_key import auth_headers
from prorl_server.launch.local_stack import LocalStack, free_port, run_with_stack
from prorl_server.launch.slurm_cli import add_arguments, run_from_args

__all__ = ["LocalStack", "add_arguments", "auth_headers", "free_port", "run_from_args", "run_with_stack"]
