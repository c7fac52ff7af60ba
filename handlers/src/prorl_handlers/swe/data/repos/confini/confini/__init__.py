"""A small INI configuration reader with typed getters."""

from confini.config import Config
from confini.parser import ConfigError, parse

__all__ = ["Config", "ConfigError", "parse"]
