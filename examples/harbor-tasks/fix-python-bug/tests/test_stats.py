"""median() of odd and even lists, unsorted, negative and float values; mean() unchanged."""

import sys

sys.path.insert(0, "/app")
from stats import mean, median

CASES = [([3], 3), ([1, 2], 1.5), ([5, 1, 3], 3), ([4, 1, 3, 2], 2.5), ([-5, 10, 0, 5], 2.5), ([0.5, 0.25], 0.375)]
failures = [f"median({v}) = {median(list(v))!r}, expected {m}" for v, m in CASES if median(list(v)) != m]
if mean([1, 2, 3, 4]) != 2.5:
    failures.append("mean() changed")
print("\n".join(failures) or "ok")
sys.exit(1 if failures else 0)
