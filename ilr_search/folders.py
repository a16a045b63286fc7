"""Folders a command is about to write (a storage's, the token cache, trial checkpoints): checked before anything
is written, so that one it cannot write is one error line, not a traceback halfway through a run."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ilr_search.errors import UserInputError


def check_can_create(folder: Path, what: str, fix: str) -> None:
    """Raise a UserInputError saying `what` cannot be written and `fix`, unless `folder` can be written where it
    is there, or made where it is not. Probed with a nameless temporary file in it, or in its nearest existing
    ancestor (os.access says yes for root where the file system still says no: immutable folders, read-only
    mounts, sysfs); nothing is left behind."""
    probe = Path(folder)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise UserInputError(f"cannot write {what} ({e.strerror} in {os.path.abspath(probe)!r}); {fix}") from None
