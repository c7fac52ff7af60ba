"""Short-answer questions in one or two plain chat turns (no sandbox): a task a 135M model solves sometimes."""

from prorl_handlers.short_answer.handler import (
    ShortAnswerHandler,
    ShortAnswerTask,
    contains_answer,
    learning_tasks,
    load_questions,
)

__all__ = ["ShortAnswerHandler", "ShortAnswerTask", "contains_answer", "learning_tasks", "load_questions"]
