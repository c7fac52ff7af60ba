"""Settings of the simulated backend; the `sim-llm` command-line flags map onto these fields one to one."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prorl_server.scheduling import DEFAULT_PARALLEL_EFFICIENCY, DEFAULT_PROFILE, LatencyProfile, is_profile_path


class SimLLMSettings(BaseModel):
    """What the simulator serves and how its time runs."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535, description="0: any free port (in-process servers)")
    model_name: str = Field(default="sim-llm", description="the id in /v1/models and the accepted `model`")
    seed: int = Field(default=0, description="seeds output lengths, token ids and logprobs")
    time_scale: float = Field(default=1.0, gt=0, le=1e6, description="simulated seconds per wall-clock second")
    max_num_seqs: int = Field(default=128, ge=1, le=65536, description="most requests decoding at once")
    profile: LatencyProfile = Field(
        default=LatencyProfile.parse(DEFAULT_PROFILE), description="seconds per decode step by batch size"
    )
    model_parallel: int = Field(
        default=1, ge=1, le=1024, description="model-parallel degree: divides the profile's times (see step_profile)"
    )
    parallel_efficiency: float = Field(
        default=DEFAULT_PARALLEL_EFFICIENCY, gt=0, le=1, description="speed-up kept per doubling of model_parallel"
    )
    prefill_s_per_token: float = Field(default=1e-4, ge=0, le=10, description="prefill time per uncached token")
    block_size: int = Field(default=16, ge=1, le=4096, description="tokens per prefix-cache block")
    cache_blocks: int = Field(default=8192, ge=0, description="prefix-cache capacity in blocks (0: no cache)")
    max_model_len: int = Field(default=32768, ge=16, le=10_000_000, description="context length (prompt + output)")
    output_len_median: float = Field(default=256.0, gt=0, description="median of the lognormal output length")
    output_len_sigma: float = Field(default=1.0, ge=0, le=10, description="sigma of the lognormal output length")
    tokenizer_dir: str | None = Field(
        default=None,
        description="write the simulator's tokenizer as Hugging Face files here (testing/tokenizer_files.py: about 24 MB) "
        "and report the directory as the model's root, so a prorl-server on this machine tokenizes chats itself",
    )
    log_level: str = "warning"

    @property
    def step_profile(self) -> LatencyProfile:
        """The profile the engine steps by: `profile` for a degree-1 worker; for `model_parallel` d > 1, its
        times divided by d x `parallel_efficiency`^log2(d) (`scheduling.heterogeneous.parallel_profile`'s
        assumed scaling; pass a profile measured at that degree and leave d at 1 where you have one)."""
        if self.model_parallel == 1:
            return self.profile
        speedup = self.model_parallel * self.parallel_efficiency ** math.log2(self.model_parallel)
        return LatencyProfile(tuple((batch, seconds / speedup) for batch, seconds in self.profile.points))

    @field_validator("profile", mode="before")
    @classmethod
    def _parse_profile(cls, value: object) -> object:
        if isinstance(value, str):
            return LatencyProfile.from_file(value) if is_profile_path(value) else LatencyProfile.parse(value)
        return value
