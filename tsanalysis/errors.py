"""The errors tsanalysis raises for bad input: the ``tsanalysis`` command prints them without a traceback (exit 2).

Bad run directories and rollout files raise ``tsanalysis.io.RecordsError`` (``contracts.records``); the
library modules (``tables``, ``relay``) raise these for bad arguments, so they import nothing from the CLI.
"""

from __future__ import annotations

__all__ = ["UsageError", "RelayError"]


class UsageError(ValueError):
    """Bad input to an analysis (a missing argument, a flag combination that means nothing)."""


class RelayError(UsageError):
    """Bad relay input (checked before any model is loaded)."""
