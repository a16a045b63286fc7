"""What the CLI's renderer (cli/live.py) needs to draw a run: its event stream (search/progress.py) and how a
map is written (training/schedule.py). The CLI imports only from commands/, so these come
through here."""

from ilr_search.analysis.replicates import Replicates
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
from ilr_search.training.schedule import format_reuse_map, map_text, shown_key

__all__ = [
    "shown_key",
    "Replicates",
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
