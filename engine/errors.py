"""The error type a CLI reports as a user error: one line, exit status 2, no traceback (``--debug`` shows it)."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """Bad input that the user can fix: a config value, a missing data file, a refused resume, a locked run folder.

    A ``ValueError`` subclass, so library callers that catch ``ValueError`` keep working.
    """
