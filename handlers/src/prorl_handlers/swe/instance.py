"""SWE-bench-style instances: reading and checking one, and loading the shipped ones."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).parent / "data"
INSTANCES_FILE = DATA_DIR / "instances.jsonl"
TEXT_FIELDS = ("instance_id", "repo", "base_commit", "problem_statement", "test_patch")
TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")


@dataclass(frozen=True)
class SWEInstance:
    """The fields of an instance the handler uses (SWE-bench names; `patch`, the gold fix, is not read)."""

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    test_patch: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]

    @classmethod
    def from_dict(cls, instance: dict[str, Any]) -> SWEInstance:
        """Check and read an instance; test lists may be JSON lists or JSON-encoded strings (as in SWE-bench)."""
        missing = [key for key in TEXT_FIELDS + TEST_LISTS if key not in instance]
        if missing:
            raise ValueError(f"the swe instance lacks {', '.join(missing)} (SWE-bench field names)")
        texts = {key: instance[key] for key in TEXT_FIELDS}
        if not all(isinstance(value, str) for value in texts.values()):
            raise ValueError(f"{', '.join(TEXT_FIELDS)} must be strings")
        return cls(
            **texts, fail_to_pass=_tests(instance, "FAIL_TO_PASS"), pass_to_pass=_tests(instance, "PASS_TO_PASS")
        )

    @property
    def workdir(self) -> str:
        """Where the repository is checked out in a sandbox."""
        return f"/workspace/{self.repo}"


def _tests(instance: dict[str, Any], key: str) -> list[str]:
    value = instance[key]
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, list) or not all(isinstance(test, str) for test in value):
        raise ValueError(f"{key} must be a list of pytest node ids (or that list as a JSON string)")
    return value


def load_instances(path: Path = INSTANCES_FILE) -> list[dict[str, Any]]:
    """The instances of a JSON-lines file (default: the shipped ones), each with `data_source: "swe"`."""
    with path.open(encoding="utf-8") as lines:
        return [{"data_source": "swe", **json.loads(line)} for line in lines if line.strip()]
