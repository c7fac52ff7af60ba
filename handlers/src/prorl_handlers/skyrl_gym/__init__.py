"""A skyrl-gym text environment (`skyrl_gym.envs.BaseTextEnv`) as a prorl-server handler (docs/environments.md)."""

from prorl_handlers.skyrl_gym.handler import SkyRLGymHandler, SkyRLGymTask

__all__ = ["SkyRLGymHandler", "SkyRLGymTask"]
