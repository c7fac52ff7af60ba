"""Questions whose answer is in a file of the sandbox, read with `bash`: the tool-use learning task."""

from prorl_handlers.file_question.handler import FileQuestionHandler, FileQuestionTask, learning_tasks

__all__ = ["FileQuestionHandler", "FileQuestionTask", "learning_tasks"]
