"""prorl-server's first-party handlers: `math`, `swe`, `code`, `short_answer`, `judged_answer`,
`external_agent` and `harbor` (see each subpackage's docstring)."""
