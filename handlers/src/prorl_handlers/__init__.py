"""prorl-server's first-party handlers: `math`, `swe` and `code` (see each subpackage's docstring)."""
