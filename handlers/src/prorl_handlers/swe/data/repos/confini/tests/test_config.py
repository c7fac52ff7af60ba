import pytest

from confini import Config, ConfigError

TEXT = """
[server]
host = example.org
port = 8080
debug = yes
"""


def test_get():
    config = Config.from_string(TEXT)
    assert config.get("server", "host") == "example.org"
    assert config.get("server", "missing", "dflt") == "dflt"
    assert config.get("nosuch", "host") is None


def test_sections():
    assert Config.from_string(TEXT).sections() == ["server"]


def test_getint():
    config = Config.from_string(TEXT)
    assert config.getint("server", "port") == 8080
    with pytest.raises(ConfigError):
        config.getint("server", "host")


def test_getbool_true_values():
    config = Config.from_string(TEXT)
    assert config.getbool("server", "debug") is True
    assert config.getbool("server", "missing", default=False) is False
