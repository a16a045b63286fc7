"""What the CLI's renderer (cli/ui.py) needs to draw a run: its event stream (search/progress.py) and how a
map is written (training/schedule.py). The CLI imports only from commands/, so these come
through here."""

from ilr_search.knobs import format_knobs
from ilr_search.search.progress import (
    Event,
    Message,
    ReferenceFinished,
    ReferenceStarted,
    RunFinished,
    RunReporter,
    RunsStarted,
    Step,
    StudyStarted,
    TrialFinished,
    TrialStarted,
)
from ilr_search.training.schedule import as_block, format_reuse_map, is_baseline_key, map_text, shown_key

__all__ = [
    "as_block",
    "is_baseline_key",
    "shown_key",
    "Event",
    "Message",
    "ReferenceFinished",
    "ReferenceStarted",
    "RunFinished",
    "RunReporter",
    "RunsStarted",
    "Step",
    "StudyStarted",
    "TrialFinished",
    "TrialStarted",
    "format_knobs",
    "format_reuse_map",
    "map_text",
]
