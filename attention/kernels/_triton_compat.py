"""What the Triton kernels need to run the same under every supported triton (3.6 with torch 2.11 to 3.9 with 2.15).

``range`` bounded by a runtime kernel argument (``for n0 in range(0, L, BLOCK_N)``) fails under triton 3.6's
interpreter (``TRITON_INTERPRET=1``) with NumPy 2: it holds every scalar argument as a 1-element array, and ``range``
calls its ``__index__``, ``int(array)``, which NumPy 2 refuses ("only 0-dimensional arrays can be converted to Python
scalars"); triton 3.9 squeezes the array first. :func:`loop_bound` hands ``range`` a Python int under the interpreter
and the argument itself when compiling, so the compiled kernels are unaffected. (The alternatives change them: a
``while`` loop gives up Triton's software pipelining of ``for`` loops and takes far more registers a thread; a
constexpr bound compiles one kernel per sequence length.)
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

__all__ = ["INTERPRETED", "loop_bound"]

# Triton reads TRITON_INTERPRET when a kernel is defined (the kernels' modules are imported in the dispatch branch).
INTERPRETED: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def loop_bound(n):
    """``n`` as a loop bound: a Python int under the interpreter, the runtime argument itself when compiled."""
    if INTERPRETED:  # a constexpr branch: the compiler never visits it
        # returned, not assigned: the interpreter turns every assigned value back into a tensor
        return n.handle.data.item()
    return n
