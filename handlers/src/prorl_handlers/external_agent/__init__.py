"""`external_agent`: any OpenAI- or Anthropic-speaking command as a task, without writing a handler.

An instance names the command (the agent), the files to put in its sandbox, a time budget, and how to score::

    {"data_source": "external_agent",
     "command": "python3 react_agent.py 'Write the number of lines of data.txt to answer.txt'",
     "files": {"react_agent.py": "<source>", "data.txt": "a\\nb\\nc\\n"},
     "time_budget_s": 600,
     "collect": ["answer.txt"],
     "score": {"command": "test \\"$(cat answer.txt)\\" = 3", "reward": "exit_code", "files": {}, "timeout_s": 300}}

- RUN opens the job's gateway session (docs/gateway.md), starts a sandbox without network that reaches it
  (`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `OPENAI_MODEL` and `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`,
  `ANTHROPIC_MODEL` set for every process: Chat Completions, Responses and Anthropic Messages are each
  recorded token-exact), writes `files` (paths relative
  to the working directory, /workspace), and runs `command` there in bash within `time_budget_s`; then it
  reads the `collect` files (text, at most 1 MiB each) into `artifacts["files"]` (those missing or too large
  are listed in `artifacts["missing_files"]`). `artifacts["agent"]` has the command's exit code, whether it
  timed out, and the end of its output.
- EVAL starts a fresh sandbox (the agent never touched it), writes the collected files and `score.files`,
  and runs `score.command`: with `reward: "exit_code"` the reward is 1.0 when it exits 0, else 0.0; with
  `"stdout"` it is the number on the last line of its standard output (0.0 if there is none, or it failed).
- The session's recording, token-exact, is `artifacts["gateway"]`: one entry with `chains` (each with its
  `segments`, each with `prompt_ids`, `response_ids`, `response_mask`, `response_logprobs` and its turns),
  `main_chain`, `reward_chains`, `segments` (all of them), `rewrites`, `calls`, `side_calls`; when the reward
  chains are one chain of one segment, that segment is also the result's `trajectory`. The instance's
  `session` (`model`, `accept_any_model`, `side_calls`, `reward_chains`) opens the session: e.g.
  `"session": {"reward_chains": "agents"}` gives the reward to the main agent and its sub-agents alike.

The sandbox is the server's default (`--image`); the command runs with that image's programs. Three example
agents are here, each a loop over a `bash` tool written with an official SDK alone (nothing of prorl-server),
with the same command line (`python3 AGENT "the task" [--max-steps N] [--max-tokens N]`):

- `react_agent.py`: OpenAI Chat Completions (`openai`), tool calls answered by tool messages;
- `responses_agent.py`: OpenAI Responses (`openai`, `client.responses.create`), `function_call` items
  answered by `function_call_output` items, the whole conversation sent as input each time;
- `anthropic_agent.py`: Anthropic Messages (`anthropic`), `tool_use` blocks answered by `tool_result` blocks.

`example_instance(task, score, agent=...)` makes an instance that runs one (`"chat"`, the default,
`"responses"` or `"anthropic"`). Their sandbox's Python must import `openai` and `anthropic`: under bubblewrap
without an image that is the server's own Python (the `test` extra installs both); for an Apptainer image,
build one with them: `prorl-server build-image python --lockfile
handlers/src/prorl_handlers/external_agent/requirements.txt` (docs/gateway.md).
"""

import shlex
from pathlib import Path
from typing import Any

from prorl_handlers.external_agent.handler import ExternalAgentHandler
from prorl_handlers.external_agent.instance import ExternalAgentInstance, Score, SessionOptions

EXAMPLE_AGENTS = {
    "chat": Path(__file__).parent / "react_agent.py",
    "responses": Path(__file__).parent / "responses_agent.py",
    "anthropic": Path(__file__).parent / "anthropic_agent.py",
}
"""The example agents by the API they speak."""


def example_instance(task: str, score: dict[str, Any], agent: str = "chat", **fields: Any) -> dict[str, Any]:
    """An instance running the example agent `agent` (a key of EXAMPLE_AGENTS) on `task` (other instance
    fields, e.g. `collect`, as keywords)."""
    script = EXAMPLE_AGENTS[agent]
    files = {script.name: script.read_text(), **fields.pop("files", {})}
    return {
        "data_source": "external_agent",
        "command": f"python3 {script.name} {shlex.quote(task)}",
        "files": files,
        "score": score,
        **fields,
    }


__all__ = [
    "EXAMPLE_AGENTS",
    "ExternalAgentHandler",
    "ExternalAgentInstance",
    "Score",
    "SessionOptions",
    "example_instance",
]
