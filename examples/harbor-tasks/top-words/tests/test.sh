#!/bin/bash
python3 /tests/check.py
