"""Shared test helpers: the MLX reference (when installed) and dtype tables."""

from __future__ import annotations

import pytest

try:  # MLX itself, as the reference for exact semantics; tests using it skip when absent
    import mlx.core as mlx_ref  # type: ignore
except Exception:  # pragma: no cover
    mlx_ref = None

requires_mlx = pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed")


@pytest.fixture
def mlx():
    if mlx_ref is None:
        pytest.skip("mlx is not installed")
    return mlx_ref
