"""prorl-server's first-party handlers: `math`, `swe`, `code`, `short_answer` and `judged_answer` (see each
subpackage's docstring)."""
