"""Trainer-side helpers: `LocalStack` runs a dev engine and a prorl-server as child processes."""

from prorl_server.client.local_stack import LocalStack, free_port, run_with_stack

__all__ = ["LocalStack", "free_port", "run_with_stack"]
