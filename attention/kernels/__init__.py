"""Fast kernels behind :mod:`attention`'s dispatch. A kernel's module (and triton or numba) is imported only inside
the branch that uses it; :mod:`.ops` (the launches as operators) and :mod:`.limits` need neither and load with
:mod:`attention`."""
