"""Synthetic completions: token ids, logprobs and where they stop, drawn from a per-request seeded generator.

Each request gets its own generator, seeded from the simulator's seed, the prompt's ids and: nothing else
for a greedy request (temperature below 1e-5: the same prompt always gives the same output), the request's
`seed` when it has one, otherwise its arrival number. So the same requests in the same order give the
same outputs, and a request with a seed gives the same output whenever it comes.

Output length: with `ignore_eos`, exactly `max_tokens`; otherwise a lognormal draw (median and sigma set by
the simulator), ending with the end-of-sequence id when it is within `max_tokens` (`finish_reason` "stop",
the id last in `token_ids`, left out of the text), else cut at `max_tokens` ("length"). The tokens before
are lowercase letters and spaces; `stop_token_ids` and `stop` strings end a completion as in vLLM. Logprobs
are finite and <= 0; with `logprobs: N` each position has N distinct alternatives whose probabilities sum,
with the sampled token's, to less than 1.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence

from prorl_server.devllm import GREEDY_EPS, Generation, SamplingParams
from prorl_server.simllm.tokenizer import SimTokenizer

ALPHABET = "abcdefghijklmnopqrstuvwxyz "
MIN_PROBABILITY = 0.05  # the sampled token's probability is drawn from (MIN_PROBABILITY, 1]


def request_rng(seed: int, params: SamplingParams, arrival: int, prompt: Sequence[int]) -> random.Random:
    """The generator of one request (see the module docstring for what it is seeded from)."""
    if params.temperature < GREEDY_EPS:
        key: tuple[object, ...] = ("greedy",)
    elif params.seed is not None:
        key = ("seed", params.seed)
    else:
        key = ("arrival", arrival)
    digest = hashlib.blake2b(repr((seed, key)).encode(), digest_size=16)
    digest.update(",".join(map(str, prompt)).encode())
    return random.Random(digest.digest())


def output_length(rng: random.Random, median: float, sigma: float) -> int:
    """Tokens the model 'wants' to write, end-of-sequence included (at least 1)."""
    return max(1, round(rng.lognormvariate(math.log(median), sigma)))


def _position(rng: random.Random, token: int, n_top: int, alphabet_ids: list[int]) -> tuple[float, list]:
    probability = 1.0 - rng.random() * (1.0 - MIN_PROBABILITY)
    rest = max(1.0 - probability, 1e-9)
    others = rng.sample([t for t in alphabet_ids if t != token], n_top) if n_top else []
    return math.log(probability), [(t, math.log(rest / 2 ** (k + 1))) for k, t in enumerate(others)]


def synthesize(
    request_id: str,
    prompt: list[int],
    params: SamplingParams,
    rng: random.Random,
    tokenizer: SimTokenizer,
    *,
    median: float,
    sigma: float,
    cache_salt: str | None = None,
) -> Generation:
    """The whole completion of one request, decided before it is scheduled (the engine only times it)."""
    gen = Generation(request_id, 0, 0, prompt, params, cache_salt=cache_salt)  # slot 0: there are no slots
    n_top = params.logprobs or 0
    gen.top_logprobs = [] if params.logprobs is not None else None
    alphabet_ids = tokenizer.encode(ALPHABET)
    wanted = params.max_tokens if params.ignore_eos else output_length(rng, median, sigma)
    text: list[str] = []
    longest_stop = max((len(s) for s in params.stop), default=0)

    def emit(token: int) -> None:
        logprob, alternatives = _position(rng, token, min(n_top, len(alphabet_ids) - 1), alphabet_ids)
        gen.output_ids.append(token)
        gen.logprobs.append(logprob)
        if gen.top_logprobs is not None:
            gen.top_logprobs.append(alternatives)

    while len(gen.output_ids) < params.max_tokens:
        if len(gen.output_ids) == wanted - 1 and not params.ignore_eos:
            emit(tokenizer.eos_id)
            gen.finish_reason, gen.stop_reason = "stop", None
            break
        token = rng.choice(alphabet_ids)
        emit(token)
        text.append(tokenizer.token_str(token))
        if token in params.stop_token_ids:
            gen.finish_reason, gen.stop_reason = "stop", token
            if not params.include_stop_str_in_output:
                text.pop()
            break
        joined = "".join(text[-longest_stop:]) if longest_stop else ""
        stop = next((s for s in params.stop if joined.endswith(s)), None)
        if stop is not None:
            gen.finish_reason, gen.stop_reason = "stop", stop
            if not params.include_stop_str_in_output:
                del text[len(text) - len(stop) :]
            break
    gen.text = "".join(text)
    return gen
