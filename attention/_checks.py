"""Deprecated alias of :mod:`attention.checks` (the public module), kept so code written against it still imports."""

from .checks import *  # noqa: F403
from .checks import __all__  # noqa: F401
