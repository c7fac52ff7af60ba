"""`harbor`: Harbor / Terminal-Bench task folders, each built into its image and scored by its own tests.

The server's tasks directory ($PRORL_HARBOR_TASKS) holds task folders in Harbor's format (`task.toml`,
`instruction.md`, `environment/Dockerfile`, `tests/test.sh`, `solution/solve.sh`); an instance names one and
the agent that runs it::

    {"data_source": "harbor", "task": "count-lines"}                       # the built-in agent loop
    {"data_source": "harbor", "task": "count-lines", "agent": "oracle"}    # the task's solution/solve.sh
    {"data_source": "harbor", "task": "count-lines", "agent": "command",
     "command": "python3 /tmp/harbor-agent/agent.py \\"$HARBOR_INSTRUCTION\\"", "files": {"agent.py": "..."}}
    {"data_source": "harbor", "task": "count-lines", "agent": "harness", "harness": "claude_code"}

- At submission the task's name is checked (relative, inside the tasks directory), and its folder: the files
  it needs, task.toml against Harbor's schema, the Dockerfile's conversion; what is wrong is a 400 naming
  the file and the field or line.
- INIT builds the task's image from environment/Dockerfile (`prorl_server.imaging.dockerfile`, FROM mapped
  by $PRORL_HARBOR_BASE_MAP), cached by its content, within `[environment] build_timeout_sec`; a failed
  build fails the job naming the Dockerfile's line, and leaves nothing in the cache.
- RUN starts a sandbox of the image in the Dockerfile's WORKDIR (its files unpacked there, the agent's to
  change) with `[environment]` cpus, memory_mb and storage_mb as its limits and no network, and runs the
  agent within `[agent] timeout_sec`: the shared agent loop (bash, str_replace_editor, submit) with
  instruction.md as the user message; or `command` in bash with the instruction in $HARBOR_INSTRUCTION,
  through the job's gateway session as `external_agent` does (`files` written under /tmp/harbor-agent); or a
  harness preset on the instruction, through the session, with the job's `agent_config.max_turns` (30) as
  its turn limit (`prorl_handlers.harnesses.sandbox`, as for `external_agent`); or
  `bash /solution/solve.sh` with the task's solution/ at /solution. The working directory is then packed.
- EVAL starts a fresh sandbox of the same image, unpacks the agent's working directory into it, puts tests/
  at /tests and a writable /logs/verifier, and runs `bash /tests/test.sh` within `[verifier] timeout_sec`.
  The reward is /logs/verifier/reward.json's "reward" (its other numbers are `rewards`), else the number in
  reward.txt; without either, or past the timeout, it is 0.0 with the error.

Harbor runs its verifier in the agent's own container after the agent; here the agent's sandbox is closed
after RUN, so what carries over is its working directory, the one place its unprivileged user may change
(files elsewhere, /tmp included, do not). The tasks shipped with the repository are in
`examples/harbor-tasks/` (docs/harbor.md).
"""

from prorl_handlers.harbor.handler import HarborHandler
from prorl_handlers.harbor.instance import HarborInstance
from prorl_handlers.harbor.task import HarborTask, TaskConfig, TaskError, load_task

__all__ = ["HarborHandler", "HarborInstance", "HarborTask", "TaskConfig", "TaskError", "load_task"]
