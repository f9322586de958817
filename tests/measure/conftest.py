"""Fixtures for the measure tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def single_thread():
    """The measure tests use tiny tensors: one intra-op thread avoids thread hand-off cost on a busy 2-core CI box."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
