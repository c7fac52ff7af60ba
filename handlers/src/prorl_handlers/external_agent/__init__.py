"""`external_agent`: any OpenAI-speaking command as a task, without writing a handler.

An instance names the command (the agent), the files to put in its sandbox, a time budget, and how to score::

    {"data_source": "external_agent",
     "command": "python3 react_agent.py 'Write the number of lines of data.txt to answer.txt'",
     "files": {"react_agent.py": "<source>", "data.txt": "a\\nb\\nc\\n"},
     "time_budget_s": 600,
     "collect": ["answer.txt"],
     "score": {"command": "test \\"$(cat answer.txt)\\" = 3", "reward": "exit_code", "files": {}, "timeout_s": 300}}

- RUN opens the job's gateway session (docs/gateway.md), starts a sandbox without network that reaches it
  (`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `OPENAI_MODEL` set for every process), writes `files` (paths relative
  to the working directory, /workspace), and runs `command` there in bash within `time_budget_s`; then it
  reads the `collect` files (text, at most 1 MiB each) into `artifacts["files"]` (those missing or too large
  are listed in `artifacts["missing_files"]`). `artifacts["agent"]` has the command's exit code, whether it
  timed out, and the end of its output.
- EVAL starts a fresh sandbox (the agent never touched it), writes the collected files and `score.files`,
  and runs `score.command`: with `reward: "exit_code"` the reward is 1.0 when it exits 0, else 0.0; with
  `"stdout"` it is the number on the last line of its standard output (0.0 if there is none, or it failed).
- The session's recording, token-exact, is `artifacts["gateway"]`: one entry with `segments` (each with
  `prompt_ids`, `response_ids`, `response_mask`, `response_logprobs` and its turns), `rewrites`, `calls`;
  a recording of one segment is also the result's `trajectory`.

The sandbox is the server's default (`--image`); the command runs with that image's programs. `react_agent.py`
here is an example agent (a ReAct loop over bash with the official `openai` package); `example_instance()`
makes an instance that runs it. Its sandbox's Python must import `openai`: under bubblewrap without an image
that is the server's own Python (the `test` extra installs `openai`); for an Apptainer image, build one with
it: `prorl-server build-image python --lockfile handlers/src/prorl_handlers/external_agent/requirements.txt`
(docs/gateway.md).
"""

import shlex
from pathlib import Path
from typing import Any

from prorl_handlers.external_agent.handler import ExternalAgentHandler
from prorl_handlers.external_agent.instance import ExternalAgentInstance, Score

EXAMPLE_AGENT = Path(__file__).parent / "react_agent.py"


def example_instance(task: str, score: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """An instance running the example agent on `task` (other instance fields, e.g. `collect`, as keywords)."""
    files = {"react_agent.py": EXAMPLE_AGENT.read_text(), **fields.pop("files", {})}
    return {
        "data_source": "external_agent",
        "command": f"python3 react_agent.py {shlex.quote(task)}",
        "files": files,
        "score": score,
        **fields,
    }


__all__ = ["EXAMPLE_AGENT", "ExternalAgentHandler", "ExternalAgentInstance", "Score", "example_instance"]
