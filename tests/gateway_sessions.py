"""Shared by the gateway's tests: opening and closing a session through the trainer's endpoints."""

from __future__ import annotations


def open_session(server, **body) -> dict:
    """`POST /sessions` with `body`; the session as answered (asserting 200)."""
    answer = server.http.post("/sessions", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def close_session(server, session: dict) -> dict:
    """`DELETE /sessions/{id}`; the recording (asserting 200)."""
    answer = server.http.delete(f"/sessions/{session['session_id']}")
    assert answer.status_code == 200, answer.text
    return answer.json()
