#!/bin/bash
set -e
awk '$9 == 404' /app/access.log | wc -l > /app/answer.txt
