"""The stages, kept importable here: Stage and STAGES live in `protocol/stages.py`, below the handler layer
(`JobContext.stage`) and the wire schemas (`ErrorInfo.stage`) that use them."""

from prorl_server.protocol.stages import STAGES, Stage

__all__ = ["STAGES", "Stage"]
