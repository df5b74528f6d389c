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


# Hypothesis: a fixed sequence of examples by default, so a run (CI's included) is
# reproducible; TAPESCOPE_HYPOTHESIS_RANDOM=1 explores new examples instead.
import os as _os  # noqa: E402

from hypothesis import settings as _settings  # noqa: E402

_settings.register_profile("tapescope", derandomize=not _os.environ.get("TAPESCOPE_HYPOTHESIS_RANDOM"),
                           deadline=None)
_settings.load_profile("tapescope")
