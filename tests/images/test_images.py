"""Image templates render to Apptainer definition files; the builder's cache modes reuse and rebuild as documented.

Rendering and cache keys need no apptainer. The builds are real (`apptainer build --fakeroot`), from the local
base of scripts/setup-apptainer.sh, and skipped with the reason when apptainer or that base is missing.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from prorl_server import cli
from prorl_server.imaging import TEMPLATES, ImageBuilder, ImageBuildError
from prorl_server.imaging import images as images_module
from prorl_server.sandbox import Sandbox, SandboxSpec
from prorl_server.sandbox.apptainer import ApptainerRuntime
from prorl_server.sandbox.reaper import new_owner_id

TINY = """\
Bootstrap: localimage
From: {{ base }}

%post
    echo "{{ marker }}" > /marker
"""


@pytest.fixture
def builder(tmp_path: Path) -> ImageBuilder:
    """A builder with its own cache (for rendering and keys; nothing is built)."""
    return ImageBuilder(cache_dir=tmp_path / "cache")


def test_python_template_bootstraps_from_a_local_base(builder: ImageBuilder):
    text = builder.render("python", base="/tmp/b/base.sif", context="/tmp/ctx", lockfile=False)
    assert text.startswith("Bootstrap: localimage\nFrom: /tmp/b/base.sif\n")
    assert "    /tmp/ctx/prorl_server /opt/prorl/lib/prorl_server\n" in text
    assert "    /tmp/ctx/ptyprocess /opt/prorl/lib/ptyprocess\n" in text
    assert "python3-ipykernel python3-jupyter-client" in text and "prorl.pth" in text
    assert "pip install" not in text and "org.prorl.template python" in text


def test_without_a_base_the_python_template_debootstraps(builder: ImageBuilder):
    text = builder.render("python", base=None, context="/c", lockfile=False, ipython=False, suite="trixie")
    assert text.startswith("Bootstrap: debootstrap\nOSVersion: trixie\nMirrorURL: http://deb.debian.org/debian\n")
    assert "Include: python3\n" in text and "ipykernel" not in text


def test_swe_template_adds_git_and_build_tools_to_the_python_image(builder: ImageBuilder):
    text = builder.render("swe", base="/b.sif", context="/c", lockfile=False, packages=["jq"])
    assert text.startswith("Bootstrap: localimage\nFrom: /b.sif\n")
    assert "git build-essential patch ca-certificates jq" in text
    assert "safe.directory" in text and "prorl.pth" in text and "org.prorl.template swe" in text


def test_lockfile_is_copied_and_pip_installed(builder: ImageBuilder):
    text = builder.render("python", base="/b.sif", context="/c", lockfile=True, ipython=False)
    assert "    /c/requirements.lock /opt/prorl/requirements.lock\n" in text
    assert "python3-pip" in text and "pip install --no-cache-dir --break-system-packages -r" in text


def test_a_pip_cert_is_used_by_the_pip_install_only_and_not_left_in_the_image(builder: ImageBuilder):
    text = builder.render("python", base="/b.sif", context="/c", lockfile=True, pip_cert=True, ipython=False)
    assert "    /c/pip-cert.pem /opt/prorl/pip-cert.pem\n" in text
    install = "PIP_CERT=/opt/prorl/pip-cert.pem REQUESTS_CA_BUNDLE=/opt/prorl/pip-cert.pem \\\n        python3 -m pip"
    assert install in text and text.index(install) < text.index("    rm /opt/prorl/pip-cert.pem\n")
    assert "pip-cert" not in builder.render("python", base="/b.sif", context="/c", lockfile=True, ipython=False)


def test_unknown_templates_and_missing_variables_are_explained(builder: ImageBuilder, tmp_path: Path):
    with pytest.raises(ImageBuildError, match="built-in: python, swe"):
        builder.render("nope")
    with pytest.raises(ImageBuildError, match="'context' is undefined"):
        builder.render("python", base=None, lockfile=False)
    with pytest.raises(ImageBuildError, match="does not exist"):
        builder.render(str(tmp_path / "missing.def.j2"))


def test_versioned_key_follows_base_content_and_package_version(builder: ImageBuilder, tmp_path, monkeypatch):
    base = tmp_path / "root"
    (base / "etc").mkdir(parents=True)
    (base / "etc" / "os-release").write_text("ID=debian\n")
    inputs = builder.explain("python", "versioned", base)
    assert inputs["prorl_server_version"] == images_module.__version__ and inputs["base_sha256"]
    assert inputs["template_sha256"] == builder.template_sha256("python") and inputs["variables"]["ipython"] is True
    key = builder.key(inputs)
    assert builder.key(builder.explain("python", "versioned", base)) == key
    assert builder.key(builder.explain("python", "versioned", base, ipython=False)) != key
    (base / "etc" / "hostname").write_text("x\n")
    changed_base = builder.key(builder.explain("python", "versioned", base))
    assert changed_base != key
    monkeypatch.setattr(images_module, "__version__", "99.0")
    assert builder.key(builder.explain("python", "versioned", base)) not in (key, changed_base)


def test_lock_key_follows_the_lockfile_only(builder: ImageBuilder, tmp_path, monkeypatch):
    base = tmp_path / "base.sif"
    base.write_bytes(b"image one")
    lockfile = tmp_path / "requirements.lock"
    lockfile.write_text("numpy==2.0.0\n")
    inputs = builder.explain("python", "lock", base, lockfile)
    assert "prorl_server_version" not in inputs and "base_sha256" not in inputs and inputs["lockfile_sha256"]
    key = builder.key(inputs)
    base.write_bytes(b"image two")
    monkeypatch.setattr(images_module, "__version__", "99.0")
    assert builder.key(builder.explain("python", "lock", base, lockfile)) == key
    lockfile.write_text("numpy==2.1.0\n")
    assert builder.key(builder.explain("python", "lock", base, lockfile)) != key
    with pytest.raises(ImageBuildError, match="needs a lockfile"):
        builder.explain("python", "lock", base)


def test_template_hash_covers_the_templates_a_template_extends(tmp_path: Path):
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES, templates)
    builder = ImageBuilder(cache_dir=tmp_path / "cache", templates=templates)
    before = builder.template_sha256("swe")
    (templates / "python.def.j2").write_text((templates / "python.def.j2").read_text() + "\n")
    assert builder.template_sha256("swe") != before


def test_cli_explain_prints_the_key_and_its_inputs(tmp_path: Path, capsys):
    base = tmp_path / "base.sif"
    base.write_bytes(b"image")
    cli.main(["build-image", "swe", "--base", str(base), "--cache-dir", str(tmp_path), "--explain"])
    shown = json.loads(capsys.readouterr().out)
    builder = ImageBuilder(cache_dir=tmp_path)
    assert shown["inputs"] == builder.explain("swe", "versioned", base)
    assert shown["key"] == builder.key(shown["inputs"])


# --- real builds -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One image cache for the module's builds (under /tmp, where apptainer sees it); the cleaned base is shared."""
    return tmp_path_factory.mktemp("image-cache")


@pytest.fixture
def tiny(tmp_path: Path) -> str:
    """A small template: the base plus one file (a build takes seconds)."""
    path = tmp_path / "tiny.def.j2"
    path.write_text(TINY)
    return str(path)


def test_versioned_builds_once_and_rebuilds_for_a_new_version(base, build_cache, tiny, monkeypatch):
    builder = ImageBuilder(cache_dir=build_cache)
    first = builder.build(tiny, "versioned", base, marker="v")
    assert not first.cached and first.path.is_file() and first.path.parent == build_cache
    assert json.loads(first.path.with_suffix(".json").read_text()) == first.inputs
    again = builder.build(tiny, "versioned", base, marker="v")
    assert again.cached and again.path == first.path and again.path.stat().st_ino == first.path.stat().st_ino
    monkeypatch.setattr(images_module, "__version__", "99.0")
    bumped = builder.build(tiny, "versioned", base, marker="v")
    assert not bumped.cached and bumped.path != first.path and first.path.exists()


def test_lock_reuses_until_the_lockfile_changes(base, build_cache, tiny, tmp_path, monkeypatch):
    builder = ImageBuilder(cache_dir=build_cache)
    lockfile = tmp_path / "requirements.lock"
    lockfile.write_text("# nothing pinned yet\n")
    first = builder.build(tiny, "lock", base, lockfile, marker="l")
    monkeypatch.setattr(images_module, "__version__", "99.0")
    again = builder.build(tiny, "lock", base, lockfile, marker="l")
    assert not first.cached and again.cached and again.path == first.path
    lockfile.write_text("# still nothing, but another file\n")
    changed = builder.build(tiny, "lock", base, lockfile, marker="l")
    assert not changed.cached and changed.path != first.path


def test_scratch_always_rebuilds_and_out_gets_the_image(base, build_cache, tiny, tmp_path):
    builder = ImageBuilder(cache_dir=build_cache)
    out = tmp_path / "images" / "tiny.sif"
    first = builder.build(tiny, "scratch", base, out=out, marker="s")
    inode = out.stat().st_ino
    second = builder.build(tiny, "scratch", base, out=out, marker="s")
    assert first.path == second.path == out and not first.cached and not second.cached and first.key is None
    assert out.stat().st_ino != inode


def test_a_failing_build_reports_the_log(base, build_cache, tmp_path):
    template = tmp_path / "broken.def.j2"
    template.write_text(TINY.replace('echo "{{ marker }}" > /marker', "exit 3"))
    with pytest.raises(ImageBuildError, match="failed with exit status") as failure:
        ImageBuilder(cache_dir=build_cache).build(str(template), "scratch", base)
    assert "exit 3" in str(failure.value) and "full log" in str(failure.value)


@pytest.fixture
async def python_image_sandbox(base, build_cache, tmp_path) -> AsyncIterator[Sandbox]:
    """A sandbox of the built `python` image that runs the image's own execution server (no host bind)."""
    image = ImageBuilder(cache_dir=build_cache).build("python", "versioned", base, out=tmp_path / "py.sif").path
    runtime = ApptainerRuntime(new_owner_id(), host_tools=False, cache_dir=build_cache)
    sandbox = await runtime.start(SandboxSpec(image=str(image)))
    yield sandbox
    await sandbox.close()
    shutil.rmtree(runtime.base_dir / runtime.owner, ignore_errors=True)
    assert not os.path.exists(sandbox.slot.directory)


async def test_built_python_image_runs_its_own_execution_server(python_image_sandbox):
    assert await python_image_sandbox.tools.ping() > 0
    code = "import prorl_server.tool_server as t, ptyprocess; print(t.__file__)"
    observation = await python_image_sandbox.bash(f"echo built; python3 -c '{code}'; ls /.prorl 2>&1 | wc -l")
    assert observation.output.split() == ["built", "/opt/prorl/lib/prorl_server/tool_server/__init__.py", "1"]


async def test_built_python_image_runs_ipython(python_image_sandbox):
    """Debian bookworm's jupyter_client 7.4 (async channel methods behind sync wrappers) works like 8.x."""
    assert (await python_image_sandbox.ipython("x = 6 * 7", timeout=60)).exit_code == 0
    assert (await python_image_sandbox.ipython("x", timeout=30)).output.strip() == "42"
    failed = await python_image_sandbox.ipython("1 / 0", timeout=30)
    assert failed.exit_code == 1 and failed.error_name == "ZeroDivisionError" and "Traceback" in failed.output
