#!/bin/bash
# Reward 1 when /app/bin/greet is executable and greets as asked, else 0.
fail() { echo "$1"; echo 0 > /logs/verifier/reward.txt; exit 0; }
[ -x /app/bin/greet ] || fail "/app/bin/greet is missing or not executable"
[ "$(/app/bin/greet)" = "Hello, world!" ] || fail "without arguments: $(/app/bin/greet 2>&1)"
expected=$'Hello, Ada!\nHello, Alan Turing!'
[ "$(/app/bin/greet Ada 'Alan Turing')" = "$expected" ] || fail "two names: $(/app/bin/greet Ada 'Alan Turing' 2>&1)"
echo ok
echo 1 > /logs/verifier/reward.txt
