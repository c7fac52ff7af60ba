#!/bin/bash
set -e
python3 - <<'PY'
import collections, json, re
words = re.findall(r"[a-z]+", open("/app/poem.txt").read().lower())
json.dump([[w, c] for w, c in collections.Counter(words).most_common(3)], open("/app/top.json", "w"))
PY
