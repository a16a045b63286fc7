"""ilr-search: search per-layer recurrence (reuse maps) of transformer language models under a FLOP budget."""

__version__ = "0.1.0"
