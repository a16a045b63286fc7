"""`ilr-search studies` and `trials`, and the study a reading command takes without --study: stored studies
read back (search/studies.py; reading one does not import torch)."""

from ilr_search.search.studies import (
    Fidelity,
    FrontRow,
    StudyListing,
    StudyReport,
    default_study,
    list_studies,
    trials_report,
)

__all__ = ["Fidelity", "FrontRow", "StudyListing", "StudyReport", "default_study", "list_studies", "trials_report"]
