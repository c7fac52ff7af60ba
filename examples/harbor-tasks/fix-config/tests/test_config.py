"""The port and the log level are fixed, and nothing else of the file changed."""

import configparser
import sys

ORIGINAL = "/tests/service.ini"
FIXED = "/app/service.ini"

with open(ORIGINAL) as f:
    before = f.read().splitlines()
with open(FIXED) as f:
    after = f.read().splitlines()
config = configparser.ConfigParser()
config.read(FIXED)
problems = []
if config.get("server", "port", fallback=None) != "8080":
    problems.append("[server] port is not 8080")
if config.get("logging", "level", fallback=None) != "debug":
    problems.append("[logging] level is not debug")
changed = [i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b]
if len(before) != len(after) or len(changed) != 2:
    problems.append(f"lines other than the two settings changed: {len(before)} -> {len(after)} lines, {changed}")
if config.get("cache", "port", fallback=None) != "6379":
    problems.append("[cache] port changed")
print("\n".join(problems) or "ok")
sys.exit(1 if problems else 0)
