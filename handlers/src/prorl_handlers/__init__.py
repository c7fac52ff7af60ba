"""prorl-server's first-party handlers: `math`, `swe`, `code` and `short_answer` (see each subpackage's docstring)."""
