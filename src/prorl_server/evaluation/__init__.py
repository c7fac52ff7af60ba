"""`prorl-server eval`: score a model behind a prorl-server on a set of task instances, `k` samples each.

Every instance of the tasks file (JSONL, one `instance` of `POST /jobs` a line) runs `k` times, each run a
job of its own; a sample passes when its reward is at least the pass threshold, and a job that does not
complete (failed, timeout, cancelled, stale) scores 0 and does not pass. pass@1 and pass@k are the unbiased
estimator of Chen et al. 2021 per instance (`pass_at_k`), averaged over instances.

`--json PATH` writes the `Report` (report.py):

- `k`, `pass_threshold`, `server`, `tasks` (the file's path), `wall_s` (seconds the whole run took);
- `sources`: data_source -> row; `overall`: the row of all sources. A row has `instances`, `samples`,
  `failed` (samples whose job did not complete), `mean_reward` (over samples), `pass_at_1`, `pass_at_k`
  (over instances) and `mean_tokens` (model tokens of the response, `response_mask` ones, per sample).

Modules: pass_at_k.py (the estimator), report.py (aggregation, the table), runner.py (the jobs, through
`RolloutClient`), tracking.py (MLflow, W&B offline; imported only when asked), cli.py (the flags).
"""

from prorl_server.evaluation.cli import add_arguments, run_from_args
from prorl_server.evaluation.errors import EvalError
from prorl_server.evaluation.pass_at_k import pass_at_k
from prorl_server.evaluation.report import Report, Row, Sample, aggregate, table

__all__ = ["EvalError", "Report", "Row", "Sample", "add_arguments", "aggregate", "pass_at_k", "run_from_args", "table"]
