#!/bin/bash
# Reward 1 when /app/answer.txt holds the number of requests with status 404, else 0.
expected=$(awk '$9 == 404' /tests/access.log | wc -l)
answer=$(tr -d '[:space:]' < /app/answer.txt 2>/dev/null)
echo "expected $expected, got '$answer'"
if [ "$answer" = "$expected" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
