"""The OpenAI-compatible gateway: any harness that speaks OpenAI's Chat Completions API reaches the policy
through a session, and every completion is recorded token-exact (docs/gateway.md).

Laid out as vLLM's entrypoints are: `protocol` (wire models), `serving` (request to answer), `router` (thin
routes), with `sessions` (the open sessions: keys, bounds, closing, the close answer), `recorder` (the
token-exact segments of each chain), `chains` (which chain, and which segment of it, a call joins),
`messages` (a harness's messages as the template and the comparison see them) and `errors` (OpenAI's error
shape). This package imports no handler code, so `JobContext` can open sessions.
"""
