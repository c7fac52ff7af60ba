"""prorl-server's first-party handlers: `math`, `swe`, `code`, `short_answer`, `file_question`, `judged_answer`,
`external_agent`, `harbor`, `skyrl_gym` and `verifiers` (see each subpackage's docstring)."""
