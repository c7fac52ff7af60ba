"""Partial credit: a third of the reward per pair right, in its place; written to reward.json."""

import collections
import json
import re
from pathlib import Path

words = re.findall(r"[a-z]+", Path("/tests/poem.txt").read_text().lower())
expected = [[w, c] for w, c in collections.Counter(words).most_common(3)]
try:
    answer = json.loads(Path("/app/top.json").read_text())
except (OSError, ValueError) as exc:
    answer, error = None, str(exc)
else:
    error = None
right = sum(1 for i, pair in enumerate(expected) if isinstance(answer, list) and i < len(answer) and answer[i] == pair)
print(f"expected {expected}, got {answer!r}" + (f" ({error})" if error else ""))
Path("/logs/verifier/reward.json").write_text(json.dumps({"reward": round(right / 3, 4), "pairs_right": right}))
