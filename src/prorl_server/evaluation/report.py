"""From scored samples to the figures `prorl-server eval` reports: per task source and overall."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import BaseModel, Field

from prorl_server.evaluation.pass_at_k import pass_at_k

OVERALL = "overall"
"""The row name of all sources together."""


@dataclass(frozen=True)
class Sample:
    """One finished job: which instance (its line in the tasks file) and source, its reward (0 for a job that
    did not complete), whether it passed, whether it failed, and the model tokens of its response."""

    line: int
    source: str
    reward: float
    passed: bool
    failed: bool
    tokens: int


class Row(BaseModel):
    """The figures of one source, or of all (`overall`)."""

    instances: int
    samples: int
    failed: int = Field(description="Samples whose job did not complete (failed, timeout, cancelled, stale).")
    mean_reward: float
    pass_at_1: float
    pass_at_k: float
    mean_tokens: float = Field(description="Model tokens of the response per sample.")


class Report(BaseModel):
    """What `prorl-server eval` prints and writes with --json."""

    k: int
    pass_threshold: float
    server: str
    tasks: str
    wall_s: float
    sources: dict[str, Row]
    overall: Row


def row(samples: list[Sample], k: int) -> Row:
    """The figures of `samples` (at least one): pass@1 and pass@k averaged over instances."""
    by_instance: dict[int, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_instance[sample.line].append(sample)
    p1, pk = [], []
    for group in by_instance.values():
        n, c = len(group), sum(s.passed for s in group)
        p1.append(pass_at_k(n, c, 1))
        pk.append(pass_at_k(n, c, min(k, n)))
    return Row(
        instances=len(by_instance),
        samples=len(samples),
        failed=sum(s.failed for s in samples),
        mean_reward=sum(s.reward for s in samples) / len(samples),
        pass_at_1=sum(p1) / len(p1),
        pass_at_k=sum(pk) / len(pk),
        mean_tokens=sum(s.tokens for s in samples) / len(samples),
    )


def aggregate(
    samples: Iterable[Sample], *, k: int, pass_threshold: float, server: str, tasks: str, wall_s: float
) -> Report:
    """The report of `samples` (at least one), a row per source sorted by name, and the overall row."""
    samples = list(samples)
    by_source: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_source[sample.source].append(sample)
    return Report(
        k=k,
        pass_threshold=pass_threshold,
        server=server,
        tasks=tasks,
        wall_s=wall_s,
        sources={source: row(by_source[source], k) for source in sorted(by_source)},
        overall=row(samples, k),
    )


COLUMNS = ("instances", "samples", "failed", "mean_reward", "pass_at_1", "pass_at_k", "mean_tokens")


def table(report: Report) -> str:
    """The report as a plain-text table, a line per source, then the overall line and the wall time."""
    headers = [
        "source",
        *(f"pass@{report.k}" if c == "pass_at_k" else c.replace("pass_at_1", "pass@1") for c in COLUMNS),
    ]
    rows = [[name, *_cells(r)] for name, r in [*report.sources.items(), (OVERALL, report.overall)]]
    widths = [max(len(line[i]) for line in [headers, *rows]) for i in range(len(headers))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in [headers, *rows]
    ]
    lines.insert(-1, "-" * len(lines[0]))
    lines.append(f"wall time {report.wall_s:.1f} s, k={report.k}, pass when reward >= {report.pass_threshold:g}")
    return "\n".join(lines)


def _cells(r: Row) -> list[str]:
    return [
        str(r.instances),
        str(r.samples),
        str(r.failed),
        f"{r.mean_reward:.4f}",
        f"{r.pass_at_1:.4f}",
        f"{r.pass_at_k:.4f}",
        f"{r.mean_tokens:.1f}",
    ]
