"""Directories under shared places (/tmp, /var/tmp) that another local user made first are never trusted.

A server that used a world-writable sandbox base directory made by someone else could have its next sandbox
directory swapped for a link into that user's directory. The base and cache directories are per user, mode
0700, and checked without following links.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from prorl_server.sandbox import SandboxError, SandboxSpec, make_runtime, new_owner_id
from prorl_server.sandbox.apptainer import CACHE_DIR
from prorl_server.sandbox.private_dir import ensure_private_dir
from prorl_server.sandbox.reaper import DEFAULT_BASE_DIR

OTHER_UID = 65534  # nobody: stands for another local user


def test_default_directories_are_per_user():
    assert DEFAULT_BASE_DIR.name.endswith(f"-{os.geteuid()}")
    assert CACHE_DIR.name.endswith(f"-{os.geteuid()}")


def test_a_missing_directory_is_made_private(tmp_path):
    made = ensure_private_dir(tmp_path / "a" / "base")
    info = os.lstat(made)
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()


def test_our_own_directory_that_others_may_read_is_closed(tmp_path):
    path = tmp_path / "base"
    path.mkdir(mode=0o755)
    path.chmod(0o755)
    ensure_private_dir(path)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770])
def test_a_directory_others_may_write_is_refused(tmp_path, mode):
    path = tmp_path / "base"
    path.mkdir()
    path.chmod(mode)
    with pytest.raises(SandboxError, match="others may write"):
        ensure_private_dir(path)


def test_a_symlink_is_refused_even_to_a_good_directory(tmp_path):
    target = ensure_private_dir(tmp_path / "real")
    link = tmp_path / "base"
    link.symlink_to(target)
    with pytest.raises(SandboxError, match="symbolic link"):
        ensure_private_dir(link)


def test_a_file_is_refused(tmp_path):
    (tmp_path / "base").write_text("")
    with pytest.raises(SandboxError, match="not a directory"):
        ensure_private_dir(tmp_path / "base")


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory owned by another user needs root")
def test_a_directory_of_another_user_is_refused(tmp_path):
    path = tmp_path / "base"
    path.mkdir(mode=0o700)
    os.chown(path, OTHER_UID, OTHER_UID)
    with pytest.raises(SandboxError, match=f"belongs to uid {OTHER_UID}"):
        ensure_private_dir(path)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory with a short path: a runtime refuses a base directory too long for its sandboxes' Unix
    sockets before anything else, and pytest's `tmp_path` is that long."""
    path = Path(tempfile.mkdtemp(prefix="pd-"))
    yield path
    shutil.rmtree(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory owned by another user needs root")
async def test_a_runtime_refuses_a_base_directory_another_user_made_first(short_tmp):
    """The reported attack: another user pre-creates the base directory, world-writable, no sticky bit."""
    planted = short_tmp / "prorl-sandboxes"
    planted.mkdir()
    planted.chmod(0o777)
    os.chown(planted, OTHER_UID, OTHER_UID)
    runtime = make_runtime("local", new_owner_id(), base_dir=planted)
    with pytest.raises(SandboxError, match="refusing to use"):
        await runtime.start(SandboxSpec(tools=False))
    assert os.listdir(planted) == []  # nothing of the server's went there
    runtime.close()


async def test_a_runtime_refuses_a_base_directory_that_is_a_link(short_tmp):
    elsewhere = short_tmp / "attacker"
    elsewhere.mkdir(mode=0o700)
    link = short_tmp / "prorl-sandboxes"
    link.symlink_to(elsewhere)
    runtime = make_runtime("local", new_owner_id(), base_dir=link)
    with pytest.raises(SandboxError, match="symbolic link"):
        await runtime.start(SandboxSpec(tools=False))
    assert list(Path(elsewhere).iterdir()) == []
    runtime.close()
