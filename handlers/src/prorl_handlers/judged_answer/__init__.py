"""Free-form questions scored by an LLM judge (`ctx.judge`): the answer is compared with a reference by meaning."""

from prorl_handlers.judged_answer.handler import JudgedAnswerHandler, JudgedAnswerTask, judge_prompt, load_questions

__all__ = ["JudgedAnswerHandler", "JudgedAnswerTask", "judge_prompt", "load_questions"]
