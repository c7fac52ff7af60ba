"""prorl-server's first-party handlers: `math`, `swe`, `code`, `short_answer`, `judged_answer`
and `external_agent` (see each
subpackage's docstring)."""
