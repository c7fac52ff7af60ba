"""Programming problems: the agent writes a stdin/stdout Python program, judged on hidden tests."""

from prorl_handlers.code.handler import CodeHandler, CodeTask, load_problems

__all__ = ["CodeHandler", "CodeTask", "load_problems"]
