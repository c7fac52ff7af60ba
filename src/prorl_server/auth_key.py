"""The API key of a server started without one, and how clients find it: a key file of the user's own.

As Jupyter does with its token: `prorl-server serve` given no key (no `--api-key`, no `$PRORL_API_KEY`) and
not told `--no-api-key` uses the key in the user's key file, and makes the file, with a random key, when there
is none. The file belongs to the user, not to one server: every server and client of that user finds the same
key there, on any node that shares the home directory (a Slurm cluster), without being told which server.

- Where: `$PRORL_API_KEY_FILE`, else `$XDG_CONFIG_HOME/prorl-server/api_key` (`~/.config/...` by default).
- Made with O_CREAT|O_EXCL, mode 0600, in a directory made 0700, and put in place with link(), which fails
  when the file exists: servers starting at once on several nodes end up with the one key, and a reader sees
  either no file or the whole key.
- Refused (`ApiKeyFileError`) when it is a symbolic link or not a regular file, belongs to another user, or is
  open to its group or others (others may know the key then).

Standard library only: the server's CLI and the client both import it.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from prorl_server.errors import ProrlError
from prorl_server.protocol import API_KEY_ENV

API_KEY_FILE_ENV = "PRORL_API_KEY_FILE"
"""Environment variable naming the key file (servers and clients read it)."""
DEFAULT_LOCATION = "$XDG_CONFIG_HOME/prorl-server/api_key (~/.config/prorl-server/api_key by default)"
"""Where the key file is without `$PRORL_API_KEY_FILE`, as messages say it."""
MAX_KEY_BYTES = 4096
_ALTERNATIVES = (
    f"point ${API_KEY_FILE_ENV} at another file or give the key in ${API_KEY_ENV} (a server may also run with "
    "--no-api-key: no key at all)"
)


class ApiKeyFileError(ProrlError, RuntimeError):
    """The key file cannot be used; the message names it, says why and what to do."""


def api_key_file() -> Path:
    """The key file's path: `$PRORL_API_KEY_FILE`, else `$XDG_CONFIG_HOME/prorl-server/api_key` (a relative
    XDG_CONFIG_HOME is ignored, as the XDG spec says; the default is ~/.config)."""
    configured = os.environ.get(API_KEY_FILE_ENV)
    if configured:
        return Path(configured).expanduser()
    config_home = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(config_home) if os.path.isabs(config_home) else Path.home() / ".config"
    return base / "prorl-server" / "api_key"


def read_api_key(path: Path) -> str:
    """The key in the key file `path`: FileNotFoundError when there is none, ApiKeyFileError when the file may
    not be used (a symbolic link, not a regular file, another user's, open to group or others) or holds no key."""
    try:  # O_NOFOLLOW: a symbolic link is refused; O_NONBLOCK: a FIFO does not block the open
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ApiKeyFileError(f"the API key file {path} is a symbolic link: refused; {_ALTERNATIVES}") from None
        raise ApiKeyFileError(f"cannot read the API key file {path}: {exc.strerror}; {_ALTERNATIVES}") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ApiKeyFileError(f"the API key file {path} is not a regular file: refused; {_ALTERNATIVES}")
        if info.st_uid != os.geteuid():
            raise ApiKeyFileError(
                f"the API key file {path} belongs to user id {info.st_uid}, not to this user ({os.geteuid()}): "
                f"refused; {_ALTERNATIVES}"
            )
        if info.st_mode & 0o077:
            raise ApiKeyFileError(
                f"the API key file {path} is open to its group or others (mode {stat.S_IMODE(info.st_mode):04o}), "
                f"so others may know the key: refused. Remove it (the next server start makes a new key), or, if no "
                f"one else can have read it, `chmod 600 {path}`"
            )
        data = file.read(MAX_KEY_BYTES + 1)
    key = data.strip()
    if not key or len(data) > MAX_KEY_BYTES or not key.isascii() or any(c <= 32 or c == 127 for c in key):
        raise ApiKeyFileError(
            f"the API key file {path} holds no usable key (one line of at most {MAX_KEY_BYTES} printable ASCII "
            "characters without spaces): remove it to get a new key, or write one there"
        )
    return key.decode()


def load_or_create_api_key(path: Path) -> tuple[str, bool]:
    """The key in the key file `path`, made (a random key, mode 0600) when there is none; and whether it was
    made now. ApiKeyFileError when the file may not be used or cannot be made."""
    try:
        return read_api_key(path), False
    except FileNotFoundError:
        pass
    key = secrets.token_urlsafe(32)
    if _create(path, key):
        return key, True
    return read_api_key(path), False  # another server made it meanwhile: its key


def client_api_key() -> str | None:
    """The key a client sends: `$PRORL_API_KEY`, else the key file's when there is one, else None."""
    key = os.environ.get(API_KEY_ENV)
    if key:
        return key
    try:
        return read_api_key(api_key_file())
    except FileNotFoundError:
        return None


def auth_headers() -> dict[str, str]:
    """`Authorization: Bearer <key>` with `client_api_key()`, or no header when there is no key."""
    key = client_api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


def _create(path: Path, key: str) -> bool:
    """Write `key` to a new private file next to `path`, then link it to `path`; False if `path` exists by
    then (the file is left as it is)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ApiKeyFileError(f"cannot make the API key file {path}: {exc.strerror}; {_ALTERNATIVES}") from None
    try:
        with os.fdopen(fd, "w") as file:
            os.fchmod(file.fileno(), 0o600)  # whatever the umask
            file.write(key + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.link(temporary, path)
    except FileExistsError:
        return False
    except OSError as exc:
        raise ApiKeyFileError(f"cannot make the API key file {path}: {exc.strerror}; {_ALTERNATIVES}") from None
    finally:
        temporary.unlink(missing_ok=True)
    return True
