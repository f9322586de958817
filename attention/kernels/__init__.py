"""Fast kernels behind :mod:`attention`'s dispatch; imported only inside the branch that uses them."""
