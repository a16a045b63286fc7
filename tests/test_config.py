"""One set of defaults: the config dataclasses' defaults are the default search's (default.toml)."""

import dataclasses

from ilr_search.config import SpaceConfig
from ilr_search.space import DEFAULT_SPACE, load_space


def test_the_dataclass_defaults_are_the_default_space():
    loaded = load_space(DEFAULT_SPACE)
    assert dataclasses.replace(loaded, source="") == SpaceConfig()
