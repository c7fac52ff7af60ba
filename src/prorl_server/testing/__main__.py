"""`python -m prorl_server.testing`: serve the scripted vLLM-protocol backend (a TEST DOUBLE, not an LLM)."""

from __future__ import annotations

import argparse
from pathlib import Path

from prorl_server.testing.scripted_backend import MAX_MODEL_LEN, ScriptedBackend, create_scripted_backend_app
from prorl_server.testing.tokenizer_files import write_tokenizer_files


def main(argv: list[str] | None = None) -> None:
    """Serve the scripted backend (a test double) on a port."""
    import uvicorn

    parser = argparse.ArgumentParser(description="Scripted vLLM-protocol backend (a TEST DOUBLE, not an LLM).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds per completion of replies without delay_s")
    parser.add_argument(
        "--default-reply",
        metavar="TEXT",
        help="answer TEXT when no reply is queued for a completion (default: fail it with HTTP 409)",
    )
    parser.add_argument("--legacy-token-strings", action="store_true", help="answer with token_id:N strings only")
    parser.add_argument(
        "--tokenizer-dir",
        type=Path,
        help="write the double's tokenizer as Hugging Face files here (about 24 MB) and report it as the model's "
        "root, so a prorl-server tokenizes the chats itself",
    )
    parser.add_argument(
        "--max-model-len", type=int, default=MAX_MODEL_LEN, help="the context length advertised and enforced"
    )
    args = parser.parse_args(argv)
    root = {}
    if args.tokenizer_dir is not None:
        write_tokenizer_files(args.tokenizer_dir)
        root = {"model_root": str(args.tokenizer_dir.resolve())}
    backend = ScriptedBackend(
        legacy_token_strings=args.legacy_token_strings,
        default_delay_s=args.delay,
        default_reply=args.default_reply,
        max_model_len=args.max_model_len,
        **root,
    )
    uvicorn.run(create_scripted_backend_app(backend), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
