"""Anthropic's Messages API on a gateway session (`POST /sessions/{id}/v1/messages`), recorded token-exact.

A translation onto the OpenAI path's recording: `protocol` (Anthropic's wire models), `translate` (a
Messages request as the gateway's `ChatCompletionRequest`, and the recorded call as a `message`), `errors`
(errors in Anthropic's shape), `serving` (reading the request, the streamed events) and `router` (the route).
"""
