"""What ``mx.fast.metal_kernel`` and ``mx.fast.cuda_kernel`` share (MLX:
mlx/backend/common/compiled.cpp ``get_type_string``, mlx/backend/common/metal_kernel.cpp and
mlx/backend/cuda/custom_kernel.cpp): the type string a dtype is named by in a kernel's name
and signature, and which of an input's ``_shape`` / ``_strides`` / ``_ndim`` the source uses."""

from __future__ import annotations

from typing import Sequence

import ml_dtypes
import numpy as np

# mlx/backend/common/compiled.cpp get_type_string
TYPE_STRINGS = {np.dtype(np.float32): "float", np.dtype(np.float16): "float16_t",
                np.dtype(ml_dtypes.bfloat16): "bfloat16_t", np.dtype(np.float64): "double",
                np.dtype(np.complex64): "complex64_t", np.dtype(np.bool_): "bool",
                np.dtype(np.int8): "int8_t", np.dtype(np.int16): "int16_t",
                np.dtype(np.int32): "int32_t", np.dtype(np.int64): "int64_t",
                np.dtype(np.uint8): "uint8_t", np.dtype(np.uint16): "uint16_t",
                np.dtype(np.uint32): "uint32_t", np.dtype(np.uint64): "uint64_t"}


def shape_infos(source: str, input_names: Sequence[str]) -> list:
    """Per input: whether the source mentions ``<name>_shape``, ``_strides``, ``_ndim``."""
    return [(f"{n}_shape" in source, f"{n}_strides" in source, f"{n}_ndim" in source)
            for n in input_names]


def type_string(dt) -> str:
    """MLX's get_type_string of a numpy dtype (``float``, ``bfloat16_t``, ...)."""
    return TYPE_STRINGS[np.dtype(dt)]
