"""Clean interruption: SIGINT / SIGTERM become an :class:`Interrupted` exception, never in the middle of a write.

:func:`handle_signals` (installed by :func:`engine.run` for the duration of a run) turns both signals into
:class:`Interrupted`, a ``KeyboardInterrupt`` that remembers the signal. Inside :func:`critical` (every checkpoint and
JSON write) a signal is held back until the block has finished, so a run stopped while ``torch.save`` writes
``last.pt`` keeps a complete file instead of ending in ``RuntimeError ... unexpected pos``. The run then exits with the
conventional code ``128 + signum`` (130 for SIGINT, 143 for SIGTERM) and one line saying how to resume.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["Interrupted", "critical", "handle_signals"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_state = {"depth": 0, "pending": None}


class Interrupted(KeyboardInterrupt):
    """The run received ``signum`` (SIGINT or SIGTERM); ``exit_code`` is the shell's ``128 + signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _handler(signum: int, frame: FrameType | None) -> None:
    if _state["depth"] > 0:
        _state["pending"] = signum  # raised when the critical block ends
        return
    raise Interrupted(signum)


@contextlib.contextmanager
def critical() -> Iterator[None]:
    """Holds SIGINT / SIGTERM back (when :func:`handle_signals` is active) until the block has finished."""
    _state["depth"] += 1
    try:
        yield
    finally:
        _state["depth"] -= 1
        pending = _state["pending"]
        if _state["depth"] == 0 and pending is not None:
            _state["pending"] = None
            raise Interrupted(pending)


@contextlib.contextmanager
def handle_signals() -> Iterator[None]:
    """Routes SIGINT and SIGTERM to :class:`Interrupted` inside the block; previous handlers are restored after.

    Only the main thread can install signal handlers; elsewhere (e.g. a test runner's worker thread) this is a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in _SIGNALS}
    for s in _SIGNALS:
        signal.signal(s, _handler)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _state["pending"] = None
