"""OpenAI's Responses API on a gateway session (`POST /sessions/{id}/v1/responses`), as a translation onto
the session's chat-completion recording (docs/gateway.md, "OpenAI Responses").

`protocol` (wire models), `translate` (a Responses request and the conversation it continues to a chat
request; a recorded call to a response object), `store` (the responses a session remembers for
`previous_response_id`), `serving` (read a request, answer it plain or as events), `router` (the route).
"""
