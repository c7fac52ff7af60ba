"""`swe`: fix a bug in a Python repository, scored by its tests, SWE-bench style.

An instance has SWE-bench's fields (the two test lists may also be JSON-encoded strings, as in SWE-bench)::

    {"data_source": "swe", "instance_id": "textkit-3", "repo": "textkit", "base_commit": "<40 hex digits>",
     "problem_statement": "truncate() returns strings longer than the limit ...",
     "patch": "<the gold fix, a git diff; not used>", "test_patch": "<a git diff adding the tests>",
     "FAIL_TO_PASS": ["tests/test_truncate.py::test_result_fits_the_limit"],
     "PASS_TO_PASS": ["tests/test_truncate.py::test_short_text_is_unchanged", ...]}

- An instance may also name its own image: `dockerfile`, and its repository's `base_dockerfile`, paths
  relative to the server's dataset directory (`prorl_server.imaging.instance_images`); INIT and EVAL then run
  in a sandbox of that image (built once, a layer on the base), instances without one in the server's default.
- INIT starts a sandbox and checks `repo` out at `base_commit` in `/workspace/<repo>`: the repository comes
  from `repos_dir` on the server's machine, never from the network (see `repo.py`).
- RUN is the shared agent loop with bash, str_replace_editor and submit on the issue; when it ends, submitted
  or not, the checkout's `git diff` against base_commit (new files included) is `artifacts["patch"]`.
- EVAL checks the repository out in a fresh sandbox, applies the patch (one that does not apply scores 0),
  then the test patch, runs the test files of FAIL_TO_PASS and PASS_TO_PASS, and gives reward 1.0 when every
  one of those tests passes; the details list the failures.

`load_instances()` returns the 22 shipped instances (seven small repositories under `data/repos/`);
`handlers/scripts/build_swe_instances.py` rebuilds `data/instances.jsonl` from the bugs it describes.
"""

from prorl_handlers.swe.handler import SWEHandler
from prorl_handlers.swe.instance import SWEInstance, load_instances

__all__ = ["SWEHandler", "SWEInstance", "load_instances"]
