"""MLX's ``Depends`` (``mlx/primitives.h``): its outputs are its first ``count`` inputs,
unchanged (views sharing their buffers, as ``Depends::eval`` in
``mlx/backend/common/common.cpp`` shares them); the rest of its inputs are dependencies,
evaluated first only because they are inputs. (``count`` is tapescope's parameter: MLX's
primitive knows its outputs from the array it belongs to.)"""

from __future__ import annotations

from ..primitives import MULTI_OUTPUT, define


def _shapes(shapes: list, *, count: int) -> list:
    return [tuple(s) for s in shapes[:count]]


@define("Depends", family=MULTI_OUTPUT, view=True, shape=_shapes,
        dtype="interactive/core/ops/depends.py (the inputs' dtypes)")
def depends(xp, *inputs, count):
    return inputs[:count]
