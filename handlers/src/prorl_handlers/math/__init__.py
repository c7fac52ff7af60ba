"""Math problems solved with Python: an IPython agent loop, answers checked for numeric or symbolic equality."""

from prorl_handlers.math.handler import MathHandler, MathTask, load_problems

__all__ = ["MathHandler", "MathTask", "load_problems"]
