"""Helpers shared by the elementwise tests: dtype tables, value generators, comparisons."""

from __future__ import annotations

import ml_dtypes
import numpy as np

import tapescope.core as mx

NAMES = ["bool_", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
         "float16", "float32", "float64", "bfloat16", "complex64"]
NP = {n: (ml_dtypes.bfloat16 if n == "bfloat16" else np.dtype(n.rstrip("_"))) for n in NAMES}
# relative tolerance per result dtype (exact for integers and bools)
RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-6, "float64": 1e-12, "complex64": 2e-6}


def name_of(d) -> str:
    n = repr(d).split(".")[-1]
    return "bool_" if n == "bool" else n


def values(rng: np.random.Generator, name: str, shape: tuple, positive: bool = False) -> np.ndarray:
    """Random values of a dtype, small enough that products of two stay in range."""
    if name == "bool_":
        return rng.integers(0, 2, shape).astype(bool)
    if name.startswith("uint") or name.startswith("int"):
        lo = 0 if (positive or name.startswith("u")) else -9
        return rng.integers(lo, 10, shape).astype(name)
    if name == "complex64":
        v = rng.uniform(-3, 3, shape) + 1j * rng.uniform(-3, 3, shape)
        return v.astype(np.complex64)
    v = rng.uniform(0.1 if positive else -3, 3, shape)
    return v.astype(NP[name])


def as_np(a) -> np.ndarray:
    """A tapescope or MLX array as numpy (bfloat16 widened to float32)."""
    if isinstance(a, mx.array):
        out = np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a)
    else:
        import mlx.core as mlx

        out = np.array(a.astype(mlx.float32)) if a.dtype == mlx.bfloat16 else np.array(a)
    return out.astype(np.float32) if out.dtype == ml_dtypes.bfloat16 else out


def assert_close(got: np.ndarray, want: np.ndarray, name: str, rtol: float = None) -> None:
    """Exact for integers and bools; dtype-aware relative tolerance for inexact results."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    if name in RTOL or rtol is not None:
        r = rtol if rtol is not None else RTOL[name]
        np.testing.assert_allclose(got.astype(np.complex128 if name == "complex64" else np.float64),
                                   want.astype(np.complex128 if name == "complex64" else np.float64),
                                   rtol=r, atol=r, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want.astype(got.dtype))
