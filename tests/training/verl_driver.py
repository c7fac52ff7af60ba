"""Run prorl-server's verl agent loop as verl runs it, in verl's environment (scripts/setup-verl.sh).

    <verl venv>/bin/python tests/training/verl_driver.py spec.json out.json

spec.json: {"server_url", "prompt_length", "response_length", "samples": [verl sample fields...],
"unknown_sample": {...} or null, "weight_version": int or null, "overrides": [...] or null}. The loop is
instantiated per sample through verl's registry entry with hydra, as AgentLoopWorker does; the outputs are
padded into a DataProto by AgentLoopWorker's own `_agent_loop_postprocess` and `_postprocess` (on a worker
made without Ray). out.json holds each AgentLoopOutput, the batch's tensors as lists, and the unknown sample's
error.

With `overrides` (command-line overrides as a user gives `verl.trainer.main_ppo`), verl's own `ppo_trainer`
config is composed with them instead, the file its `agent_loop_config_path` names is loaded into the
registry as AgentLoopWorker loads it, and its `default_agent_loop` entry runs the samples as written (its
`server_url` too); out.json then also holds `loop`: that entry's name and the instantiated loop's settings.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import hydra
import numpy as np
import verl
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopWorker,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.protocol import DataProto
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.import_utils import resolve_config_path

from prorl_server.client import RolloutClient
from prorl_server.training import verl_agent_loop
from prorl_server.training.verl_agent_loop import close_clients, server_weight_update


def tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer with a pad token (id 0), made offline: verl pads with `tokenizer.pad`."""
    vocab = {"<pad>": 0, "<unk>": 1}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")), pad_token="<pad>", unk_token="<unk>"
    )


def documented_config(spec: dict) -> Any:
    """verl's `ppo_trainer` config with the user's overrides and the spec's lengths; the agent loops of its
    `agent_loop_config_path` registered as AgentLoopWorker registers them."""
    directory = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    lengths = [f"data.max_prompt_length={spec['prompt_length']}", f"data.max_response_length={spec['response_length']}"]
    with initialize_config_dir(config_dir=directory, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=[*spec["overrides"], *lengths])
    for entry in OmegaConf.load(resolve_config_path(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)):
        _agent_loop_registry[entry.name] = entry
    return cfg


def config(spec: dict) -> Any:
    if spec.get("overrides"):
        return documented_config(spec)
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": spec["prompt_length"],
                    "response_length": spec["response_length"],
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "top_k": -1,
                }
            },
            "data": {},
        }
    )


def worker(cfg: Any, tok: PreTrainedTokenizerFast) -> AgentLoopWorker:
    """An AgentLoopWorker with what its padding reads, without Ray, an engine or a model config."""
    w = object.__new__(AgentLoopWorker)
    w.config = cfg
    w.rollout_config = cfg.actor_rollout_ref.rollout
    w.tokenizer = tok
    w.processor = None
    w.mm_processor_kwargs = {}
    w.reward_loop_worker_handles = None
    w.distillation_enabled = False
    return w


def agent_loop(cfg: Any, tok: PreTrainedTokenizerFast, server_url: str | None, name: str = "prorl_server"):
    """The registry's entry `name` instantiated (its server_url replaced by `server_url` unless that is None)."""
    entry = dict(_agent_loop_registry[name])
    if server_url is not None:
        entry["server_url"] = server_url
    return hydra.utils.instantiate(
        config=entry,
        trainer_config=DictConfigWrap(config=cfg),
        server_manager=None,
        tokenizer=tok,
        processor=None,
        hf_model_type=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data),
        tools=ToolListWrap([]),
    )


def plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


async def main(spec: dict) -> dict:
    cfg, tok = config(spec), tokenizer()
    w = worker(cfg, tok)
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    out: dict[str, Any] = {"registered": _agent_loop_registry["prorl_server"]["_target_"]}
    name, url = "prorl_server", spec["server_url"]
    if spec.get("overrides"):  # the documented set-up: the entry verl's config names, as written
        name, url = cfg.actor_rollout_ref.rollout.agent.default_agent_loop, None
        loop = agent_loop(cfg, tok, url, name)
        settings = ("server_url", "group_window_s", "timeout_s", "fail_on_error")
        out["loop"] = {"name": name, "type": type(loop).__name__, **{k: getattr(loop, k) for k in settings}}
    try:
        samples = spec["samples"]
        outputs = await asyncio.gather(*(agent_loop(cfg, tok, url, name).run(dict(sampling), **s) for s in samples))
        out["outputs"] = [o.model_dump(exclude={"metrics"}) for o in outputs]
        padded = [await w._agent_loop_postprocess(o, False, **s) for o, s in zip(outputs, samples, strict=True)]
        non_tensor = {k: np.array([s[k] for s in samples], dtype=object) for k in ("uid", "data_source")}
        batch: DataProto = w._postprocess(padded, input_non_tensor_batch=non_tensor)
        out["batch"] = {k: plain(v) for k, v in batch.batch.items()}
        out["non_tensor"] = {k: plain(v) for k, v in batch.non_tensor_batch.items()}
        out["len"] = len(batch)
        if spec.get("unknown_sample"):
            try:
                await agent_loop(cfg, tok, spec["server_url"]).run(dict(sampling), **spec["unknown_sample"])
                out["unknown_error"] = None
            except verl_agent_loop.UnknownTaskSource as exc:
                out["unknown_error"] = {"type": type(exc).__name__, "message": str(exc), "source": exc.data_source}
        if spec.get("weight_version") is not None:
            client = RolloutClient(spec["server_url"])
            pushed: list[str] = []

            async def push() -> str:
                pushed.append("pushed")
                return "verl update_weights"

            out["weight_push"] = await server_weight_update(client, spec["weight_version"], push)
            out["weights_after"] = {k: v.model_dump(mode="json") for k, v in (await client.weights.status()).items()}
            await client.aclose()
    finally:
        await close_clients()
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    result = asyncio.run(main(spec))
    with open(sys.argv[2], "w") as f:
        json.dump(result, f, default=str)
