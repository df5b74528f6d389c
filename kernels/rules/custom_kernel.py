"""MLX's ``CustomKernel`` (mlx/fast_primitives.h): a user's Metal kernel, ``mx.fast.metal_kernel``
(or CUDA kernel, ``mx.fast.cuda_kernel``: ``language="cuda"``, run by ``kernels/cuda/custom.py``).

Its parameters are the kernel's name, its whole MSL source (``metal/custom.py`` wrote the
signature), the launch (``grid`` threads in ``threadgroup``-sized groups, as
``dispatchThreads``), which shape / strides / ndim buffers each input passes, whether inputs
are made row-contiguous first, and the outputs' shapes, dtypes and ``init_value``. The rule
runs it as ``CustomKernel::eval_gpu`` does (mlx/backend/metal/custom_kernel.cpp): outputs
filled with ``init_value`` (else uninitialised), inputs copied to row-contiguous when asked,
buffers bound in signature order, one dispatch. Here it dispatches through the Metal shim on
the CPU (tapescope's Linux extension, opt-in: ``core/fast.py``); the Metal runtime binds the
same buffers on a GPU.
"""

from __future__ import annotations

from ..primitives import define

CUSTOM = "custom_kernel"  # a family of its own: never fused, user code


def _shapes(shapes: list, *, output_shapes, **_) -> list:
    return [tuple(s) for s in output_shapes]


def _dtypes(dtypes: list, *, output_dtypes, **_) -> list:
    return list(output_dtypes)


_WHY = {"c": "user Metal / CUDA code: runs as its own kernel, never inside a fused tape",
        "jax": "user Metal / CUDA code: no JAX equivalent to compare it with",
        "vjp": "MLX's CustomKernel has no VJP: wrap the call in mx.custom_function and give it "
               "one, as MLX's docs do for grid_sample",
        "jvp": "MLX's CustomKernel has no JVP: wrap the call in mx.custom_function",
        "vmap": "MLX's CustomKernel has no vmap rule: wrap the call in mx.custom_function"}


@define("CustomKernel", family=CUSTOM, shape=_shapes, dtype=_dtypes, why=_WHY)
def custom_kernel(xp, *inputs, **params):
    """Host buffers only (the shim; the Metal runtime shares memory with the host). A CUDA
    kernel (``mx.fast.cuda_kernel``) runs only on the CUDA runtime (its device context's ``rule``)."""
    if params.get("language") == "cuda":
        raise RuntimeError("[cuda_kernel] A CUDA kernel runs only on the CUDA runtime's GPU "
                           "streams.")
    from ..metal import custom

    return custom.run(inputs, **params)
