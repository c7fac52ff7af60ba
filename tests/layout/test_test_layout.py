"""tests/ is laid out by area, like src/: every test module sits in the folder of its area, none at the top."""

from __future__ import annotations

from repo_paths import TESTS

# Areas that are no package of src/prorl_server: what crosses them, or a family of packages.
AREAS_BEYOND_PACKAGES = {
    "cli": "the command line (cli.py and its commands)",
    "engines": "the LLM engines the tests run: devllm/, simllm/, vllm_cpu/ and the scripted test double",
    "faults": "handlers that misbehave on purpose",
    "harnesses": "the harness presets of handlers/ (prorl_handlers.harnesses)",
    "images": "building task images",
    "layout": "the shape of the code: layers, package faces, this file",
    "security": "hostile requests, sandboxes, backends and local users",
    "weights": "weight updates across llm/, api/ and client/",
}
PACKAGES = {p.name for p in (TESTS.parent / "src" / "prorl_server").iterdir() if (p / "__init__.py").exists()}


def test_no_test_module_sits_at_the_top_of_tests():
    stray = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not stray, f"move these into the folder of their area (tests/<area>/): {stray}"


def test_every_test_folder_is_a_package_or_a_named_area():
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and any(p.rglob("test_*.py"))}
    unknown = sorted(folders - PACKAGES - set(AREAS_BEYOND_PACKAGES))
    assert not unknown, f"name these folders after a package of src/prorl_server, or list them here: {unknown}"
