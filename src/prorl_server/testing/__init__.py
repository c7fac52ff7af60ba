"""Test doubles shipped with the package: a scripted vLLM-protocol backend (which can be told to misbehave),
a proxy that records a real engine's answers, and a way to run servers.

These are named as test doubles on purpose: they let tests and the pre-quickstart demo control exactly
what "the model" says. They are not an LLM.
"""

from prorl_server.testing.misbehaving import Endpoint, Fault, FaultRecord
from prorl_server.testing.recording_proxy import RecordedGeneration, RecordingProxy
from prorl_server.testing.scripted_backend import (
    NoReplyQueued,
    ScriptedBackend,
    ScriptedReply,
    ToyChatTokenizer,
    create_scripted_backend_app,
)
from prorl_server.testing.tokenizer_files import write_tokenizer_files
from prorl_server.testing.uvicorn_thread import UvicornThread

__all__ = [
    "Endpoint",
    "Fault",
    "FaultRecord",
    "NoReplyQueued",
    "RecordedGeneration",
    "RecordingProxy",
    "ScriptedBackend",
    "ScriptedReply",
    "ToyChatTokenizer",
    "UvicornThread",
    "create_scripted_backend_app",
    "write_tokenizer_files",
]
