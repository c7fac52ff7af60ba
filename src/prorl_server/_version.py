"""The version of prorl-server: one place, read by the package root, the image builder and pyproject.toml."""

__version__ = "0.1.0"
