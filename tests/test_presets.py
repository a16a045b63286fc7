"""Every shipped preset loads, and both preset tables (README, docs/search.md) list each one."""

from pathlib import Path

import pytest

from ilr_search.space import load_space

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted(p.stem for p in (ROOT / "ilr_search" / "search_spaces").glob("*.toml"))


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_loads_and_is_listed(name):
    space = load_space(name)
    assert space.model.n_layers >= 1
    for page in ("README.md", "docs/search.md"):
        assert f"`{name}`" in (ROOT / page).read_text(encoding="utf-8"), (page, name)
