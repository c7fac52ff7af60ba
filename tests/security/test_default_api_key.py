"""A key by default: `prorl-server serve` given no key uses the key in the user's key file (made, private, at
the first start), so other local users cannot reach its API; `--no-api-key` is the explicit way to serve
open. The clients (RolloutClient, `auth_headers()`, LocalStack's children) find the same key by themselves."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from serve_process import serve_executable, start_serve, stop

from prorl_server.auth_key import (
    API_KEY_FILE_ENV,
    ApiKeyFileError,
    api_key_file,
    auth_headers,
    client_api_key,
    load_or_create_api_key,
    read_api_key,
)
from prorl_server.client import SyncRolloutClient
from prorl_server.launch import LocalStack, run_with_stack
from prorl_server.protocol.server import API_KEY_ENV
from prorl_server.testing.uvicorn_thread import free_port

OTHER_UID = 65534  # nobody: stands for another local user


def user_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a user whose home is `home`, with no key given in any way (plus `extra`)."""
    env = {k: v for k, v in os.environ.items() if k not in (API_KEY_ENV, API_KEY_FILE_ENV, "XDG_CONFIG_HOME")}
    return {**env, "HOME": str(home), **extra}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def serve_once(env: dict[str, str], *options: str) -> subprocess.CompletedProcess[str]:
    """`prorl-server serve` expected to refuse to start."""
    argv = [serve_executable(), "serve", "--port", str(free_port()), "--no-entry-points", "--runtime", "local"]
    return subprocess.run([*argv, *options], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home directory of the test's, for the server child processes and for the clients in this process."""
    home = tmp_path / "home"
    home.mkdir()
    for name in (API_KEY_ENV, API_KEY_FILE_ENV, "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    return home


# --- a real `prorl-server serve` -----------------------------------------------------------------------------


def test_serve_given_no_key_makes_a_private_key_file_requires_its_key_and_reuses_it(tmp_path, home, backend):
    key_file = home / ".config" / "prorl-server" / "api_key"
    options = ("--log-level", "info", "--llm-server", backend.address, "--host", "0.0.0.0")  # key: no warning
    proc, url, log = start_serve(tmp_path, user_env(home), *options)
    try:
        key = key_file.read_text().strip()
        assert len(key) >= 40  # secrets.token_urlsafe(32)
        assert httpx.get(f"{url}/status").status_code == 401
        assert httpx.get(f"{url}/status", headers=bearer("wrong")).status_code == 401
        assert httpx.get(f"{url}/status", headers=bearer(key)).status_code == 200
        assert httpx.get(f"{url}/health").status_code == 200  # still open, for supervisors
        with SyncRolloutClient(url, trust_env=False) as client:  # given no key: it reads the same file
            assert client.status().llm_servers == 1
        # the gateway takes the default key as the operator's key, as it takes an explicit one
        session = httpx.post(f"{url}/sessions", json={}, headers=bearer(key)).json()
        models = f"{url}/sessions/{session['session_id']}/v1/models"
        assert httpx.get(models, headers=bearer(key)).status_code == 200
        assert httpx.get(models, headers=bearer(session["api_key"])).status_code == 200
        assert httpx.get(models).status_code == 401
    finally:
        stop(proc)
    info = key_file.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    assert sorted(p.name for p in key_file.parent.iterdir()) == ["api_key"]  # no temporary file left
    first_log = log.read_text()
    assert f"API key: in {key_file} (made now, mode 0600)" in first_log and key not in first_log
    assert "NO API KEY" not in first_log

    proc, url, log = start_serve(tmp_path, user_env(home), *options)  # a second start: the same key
    try:
        assert key_file.read_text().strip() == key
        assert httpx.get(f"{url}/status", headers=bearer(key)).status_code == 200
        assert httpx.get(f"{url}/status").status_code == 401
    finally:
        stop(proc)
    second_log = log.read_text()
    assert f"API key: in {key_file}. " in second_log and "made now" not in second_log and key not in second_log


def test_the_key_file_variable_and_xdg_config_home_choose_the_file(tmp_path, home):
    chosen = tmp_path / "keys" / "prorl.key"
    proc, url, _ = start_serve(tmp_path, user_env(home, **{API_KEY_FILE_ENV: str(chosen)}))
    try:
        assert httpx.get(f"{url}/status", headers=bearer(read_api_key(chosen))).status_code == 200
    finally:
        stop(proc)
    config = tmp_path / "xdg"
    proc, url, _ = start_serve(tmp_path, user_env(home, XDG_CONFIG_HOME=str(config)))
    try:
        assert httpx.get(f"{url}/status", headers=bearer(read_api_key(config / "prorl-server" / "api_key"))).is_success
    finally:
        stop(proc)
    assert not (home / ".config").exists()


def _open_to_group(path: Path) -> None:
    path.chmod(0o640)


def _open_to_others(path: Path) -> None:
    path.chmod(0o604)


def _writable_by_group(path: Path) -> None:
    path.chmod(0o620)


def _a_symlink(path: Path) -> None:
    target = path.with_name("elsewhere")
    path.rename(target)
    path.symlink_to(target)


def _another_users(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a file of another user needs root")
    os.chown(path, OTHER_UID, OTHER_UID)


@pytest.mark.parametrize(
    ("spoil", "says"),
    [
        (_open_to_group, "is open to its group or others (mode 0640), so others may know the key: refused"),
        (_open_to_others, "is open to its group or others (mode 0604)"),
        (_writable_by_group, "is open to its group or others (mode 0620)"),
        (_a_symlink, "is a symbolic link: refused"),
        (_another_users, f"belongs to user id {OTHER_UID}, not to this user"),
    ],
)
def test_serve_refuses_a_key_file_others_may_know_and_exits_non_zero(home, spoil: Callable[[Path], None], says: str):
    key_file = home / ".config" / "prorl-server" / "api_key"
    key, _ = load_or_create_api_key(key_file)
    spoil(key_file)

    done = serve_once(user_env(home))

    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"prorl-server: the API key file {key_file} ")
    assert says in done.stderr and "Traceback" not in done.stderr and key not in done.stderr
    with pytest.raises(ApiKeyFileError, match="refused"):  # nor does a client send it
        SyncRolloutClient("http://127.0.0.1:9")


def test_no_api_key_serves_open_and_leaves_the_key_file_alone(tmp_path, home):
    proc, url, log = start_serve(tmp_path, user_env(home), "--no-api-key")
    try:
        assert httpx.get(f"{url}/status").status_code == 200
    finally:
        stop(proc)
    assert not (home / ".config").exists()
    assert "NO API KEY" not in log.read_text()  # loopback only: no warning (binding beyond it: test_cli.py)


@pytest.mark.parametrize(
    ("flags", "env", "given"), [(["--api-key", "k"], {}, "--api-key"), ([], {API_KEY_ENV: "k"}, f"${API_KEY_ENV}")]
)
def test_no_api_key_together_with_a_key_is_an_error(home, flags, env, given):
    done = serve_once(user_env(home, **env), "--no-api-key", *flags)
    assert done.returncode == 2
    error = done.stderr.strip().splitlines()[-1]
    assert (
        error
        == f"prorl-server: error: --no-api-key serves without a key, but a key is given ({given}): drop one of them"
    )
    assert not (home / ".config").exists()


def test_an_explicit_key_wins_over_the_key_file(tmp_path, home):
    file_key, _ = load_or_create_api_key(api_key_file())
    proc, url, _ = start_serve(tmp_path, user_env(home, **{API_KEY_ENV: "explicit-key"}))
    try:
        assert httpx.get(f"{url}/status", headers=bearer("explicit-key")).status_code == 200
        assert httpx.get(f"{url}/status", headers=bearer(file_key)).status_code == 401
    finally:
        stop(proc)


def test_local_stack_children_and_their_clients_share_the_default_key(tmp_path, home):
    with LocalStack(tmp_path) as stack:
        server = stack.server("--no-entry-points", "--runtime", "local", "--log-level", "warning")
        assert httpx.get(f"{server}/status", trust_env=False).status_code == 401
        assert httpx.get(f"{server}/status", headers=auth_headers(), trust_env=False).status_code == 200
        with SyncRolloutClient(server, trust_env=False) as client:
            assert client.status().running
    assert auth_headers() == bearer(read_api_key(home / ".config" / "prorl-server" / "api_key"))


def test_local_stack_given_a_key_serves_with_it_and_makes_no_key_file(tmp_path, home, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "the-key-of-this-process")  # the stack's key wins over the inherited one
    with LocalStack(tmp_path, api_key="the-stacks-own-key") as stack:
        server = stack.server("--no-entry-points", "--runtime", "local", "--log-level", "warning")
        assert stack.api_key == "the-stacks-own-key"
        assert stack.auth_headers() == bearer("the-stacks-own-key")
        assert httpx.get(f"{server}/status", trust_env=False).status_code == 401
        assert httpx.get(f"{server}/status", headers=auth_headers(), trust_env=False).status_code == 401
        assert httpx.get(f"{server}/status", headers=stack.auth_headers(), trust_env=False).status_code == 200
        with SyncRolloutClient(server, api_key=stack.api_key, trust_env=False) as client:
            assert client.status().running
    assert not (home / ".config" / "prorl-server" / "api_key").exists()


def test_local_stack_without_a_key_serves_open_even_when_this_process_has_one(tmp_path, home, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "the-key-of-this-process")  # serve refuses --no-api-key with a key: taken out
    with LocalStack(tmp_path, no_api_key=True) as stack:
        server = stack.server("--no-entry-points", "--runtime", "local", "--log-level", "warning")
        assert stack.api_key is None and stack.auth_headers() == {}
        assert httpx.get(f"{server}/status", trust_env=False).status_code == 200
        with SyncRolloutClient(server, api_key="", trust_env=False) as client:
            assert client.status().running
    assert not (home / ".config" / "prorl-server" / "api_key").exists()


def test_run_with_stack_passes_the_key_choice_on(home):
    def demo(stack: LocalStack) -> int:
        server = stack.server("--no-entry-points", "--runtime", "local", "--log-level", "warning")
        assert httpx.get(f"{server}/status", trust_env=False).status_code == 401
        return 0 if httpx.get(f"{server}/status", headers=bearer("k1"), trust_env=False).status_code == 200 else 1

    assert run_with_stack("prorl-key-test-", demo, api_key="k1") == 0


def test_local_stack_takes_a_key_or_none_not_both(tmp_path):
    with pytest.raises(ValueError, match="not both"):
        LocalStack(tmp_path, api_key="k", no_api_key=True)
    with pytest.raises(ValueError, match="without spaces"):
        LocalStack(tmp_path, api_key="a key")


# --- the key file ----------------------------------------------------------------------------------------------


def test_the_key_files_path(home, monkeypatch):
    assert api_key_file() == home / ".config" / "prorl-server" / "api_key"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/config")  # not absolute: ignored, as the XDG spec says
    assert api_key_file() == home / ".config" / "prorl-server" / "api_key"
    monkeypatch.setenv("XDG_CONFIG_HOME", "/etc/xdg-of-the-user")
    assert api_key_file() == Path("/etc/xdg-of-the-user/prorl-server/api_key")
    monkeypatch.setenv(API_KEY_FILE_ENV, "~/keys/prorl")
    assert api_key_file() == home / "keys" / "prorl"


def test_servers_starting_at_once_end_up_with_one_key(tmp_path):
    path = tmp_path / "config" / "api_key"
    with ThreadPoolExecutor(16) as pool:
        outcomes = list(pool.map(lambda _: load_or_create_api_key(path), range(64)))
    assert len({key for key, _ in outcomes}) == 1
    assert [made for _, made in outcomes].count(True) == 1
    assert read_api_key(path) == outcomes[0][0]
    assert [p.name for p in path.parent.iterdir()] == ["api_key"]


def test_the_file_is_private_whatever_the_umask(tmp_path):
    previous = os.umask(0)
    try:
        load_or_create_api_key(tmp_path / "config" / "api_key")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "config" / "api_key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "config").stat().st_mode) == 0o700


def test_a_key_written_by_the_user_is_used_and_an_unusable_one_refused(tmp_path):
    path = tmp_path / "api_key"
    path.write_text("my-own-key\n")
    path.chmod(0o600)
    assert load_or_create_api_key(path) == ("my-own-key", False)
    for content in ("", "\n", "two words", "kéy", "x" * 5000):
        path.write_text(content)
        with pytest.raises(ApiKeyFileError, match="holds no usable key"):
            read_api_key(path)
    path.unlink()
    os.mkfifo(path, 0o600)  # not a regular file: refused, without blocking on the open
    with pytest.raises(ApiKeyFileError, match="is not a regular file"):
        read_api_key(path)


def test_clients_send_the_variable_else_the_key_file_else_nothing(home, monkeypatch):
    assert client_api_key() is None and auth_headers() == {}
    key, _ = load_or_create_api_key(api_key_file())
    assert client_api_key() == key and auth_headers() == bearer(key)
    monkeypatch.setenv(API_KEY_ENV, "from-the-variable")
    assert client_api_key() == "from-the-variable"
    monkeypatch.setenv(API_KEY_ENV, "")  # empty: not given, as for the server
    assert client_api_key() == key


def test_a_file_in_the_way_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ApiKeyFileError, match=r"cannot read the API key file .*/a-file/api_key: Not a directory"):
        load_or_create_api_key(blocker / "api_key")
