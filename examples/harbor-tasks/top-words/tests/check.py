"""Partial credit: a third of the reward per pair right, in its place; written to reward.json."""

import collections
import json
import re

words = re.findall(r"[a-z]+", open("/tests/poem.txt").read().lower())
expected = [[w, c] for w, c in collections.Counter(words).most_common(3)]
try:
    answer = json.load(open("/app/top.json"))
except (OSError, ValueError) as exc:
    answer, error = None, str(exc)
else:
    error = None
right = sum(1 for i, pair in enumerate(expected) if isinstance(answer, list) and i < len(answer) and answer[i] == pair)
print(f"expected {expected}, got {answer!r}" + (f" ({error})" if error else ""))
json.dump({"reward": round(right / 3, 4), "pairs_right": right}, open("/logs/verifier/reward.json", "w"))
