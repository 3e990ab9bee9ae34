"""Float tolerances a test derives from the arithmetic (docs/STANDARDS.md, "How a test states a float tolerance").

A tolerance is the rounding the two computations can differ by, never a bare 1e-12: two float32 results summed in
another order (another CPU's SIMD width, another BLAS kernel, another thread count) differ by about n roundings of
the largest term, and so do float64 ones, 2^29 times smaller.
"""
import numpy as np

EPS32 = float(np.finfo(np.float32).eps)  # 1.19e-07: the spacing of float32 numbers just above 1, relative
EPS64 = float(np.finfo(np.float64).eps)  # 2.22e-16


def summed(n: int, eps: float = EPS32) -> float:
    """Relative bound on a sum (a dot product, a mean) of ``n`` terms of one sign, computed in any order: n·eps
    (Higham's gamma_n = n·u / (1 - n·u) with u = eps / 2, for each of the two orders). For terms of both signs
    scale it by sum|x| / |sum x|, or state it as an absolute bound n·eps·max|x|."""
    return n * eps
