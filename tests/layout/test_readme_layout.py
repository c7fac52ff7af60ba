"""The README's Layout matches the tree: every unit of src/prorl_server (a top-level subpackage or module) has
its line in the Layout block, every path that block names under src/prorl_server exists, and the paragraph
on the layers names every unit in the order of `test_layers.LAYERS`."""

from __future__ import annotations

import itertools
import re

from repo_paths import REPO
from test_layers import LAYERS, SRC, _units

README = (REPO / "README.md").read_text()


def _layout_block() -> str:
    section = README.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]


def _layers_paragraph() -> str:
    section = README.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("The layers, lowest first:", 1)[1]


def _spelled(unit: str) -> str:
    return f"{unit}/" if (SRC / unit).is_dir() else f"{unit}.py"


def _entries() -> list[str]:
    """The names at the start of the block's lines for src/prorl_server (indented two spaces)."""
    block = _layout_block().split("src/prorl_server/", 1)[1].split("\nimages/", 1)[0]
    return re.findall(r"^  (\S+)", block, re.M)


def test_every_unit_has_its_line_in_the_layout():
    missing = sorted(_spelled(u) for u in _units() if _spelled(u) not in _entries())
    assert not missing, f"README's Layout lacks a line for: {missing}"


def test_every_line_of_the_layout_names_a_unit_that_exists():
    stale = [e for e in _entries() if not (SRC / e.rstrip("/")).exists()]
    assert not stale, f"README's Layout names what src/prorl_server does not have: {stale}"


def test_the_layers_paragraph_names_every_unit_in_layer_order():
    text = _layers_paragraph()
    positions = {}
    for _, units in LAYERS:
        for unit in units:
            found = re.search(rf"(?<![\w/]){re.escape(_spelled(unit))}", text)
            assert found, f"the layers paragraph does not name {_spelled(unit)}"
            positions[unit] = found.start()
    for (low_name, low), (high_name, high) in itertools.pairwise(LAYERS):
        late = max(low, key=positions.__getitem__)
        early = min(high, key=positions.__getitem__)
        assert positions[late] < positions[early], (
            f"the layers paragraph names {_spelled(late)} ({low_name}) after {_spelled(early)} ({high_name})"
        )
