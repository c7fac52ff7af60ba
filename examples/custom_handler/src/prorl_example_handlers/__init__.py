"""Example prorl-server handler plugins (a template for your own)."""

from prorl_example_handlers.countdown import CountdownHandler

__all__ = ["CountdownHandler"]
