"""MLX's ``QuantizedMatmul`` and ``GatherQMM`` as generated CUDA (``codegen/quantized.py``'s
sources, compiled through CuPy's ``RawKernel``, which caches the cubins on disk).

Planned as the CPU's (``kernels/cpu/quantized.py``, MLX's ``qmm.cu`` dispatch): each matrix of
the broadcast or gathered batch is an offset into x, w, scales and biases; up to
``MAX_ROWS`` rows of a transposed product run ``qmv`` (a warp per output, MLX's
``qmv_kernel``), everything else the shared-memory tiled product (MLX's ``qmm_naive``).
Float32 compute, rounded once to the output type by the evaluator.
"""

from __future__ import annotations

import numpy as np

from ..codegen.quantized import MAX_ROWS, QuantSpec, cuda_source
from ..primitives import by_kernel
from ..rules.quantized import FP4_LUT, fp8_decode, fp_scale

_kernels: dict = {}
WARPS = 4  # output rows per qmv block
TILE = 16


def _kernel(spec: QuantSpec, transpose: bool, tiled: bool):
    import cupy

    key = (spec.name, transpose, tiled)
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = cupy.RawKernel(cuda_source(spec, transpose, tiled), spec.name)
    return k


def _offsets(xp, a, unit: int):
    offs = np.zeros(a.shape[:-2], np.int64)
    for d, (n, st) in enumerate(zip(a.shape[:-2], a.strides[:-2])):
        shape = [1] * (a.ndim - 2)
        shape[d] = n
        offs = offs + (np.arange(n, dtype=np.int64) * (st // unit)).reshape(shape)
    return offs.reshape(-1)


def _table(xp, mode: str, bits: int):
    if mode == "affine":
        return xp.zeros(1, xp.float32)
    if bits == 4:
        return xp.asarray(FP4_LUT, dtype=xp.float32)
    return xp.ascontiguousarray(fp8_decode(xp, xp.arange(256, dtype=xp.uint8)))


def _launch(xp, x, w, scales, b, x_idx, w_sel, *, group_size, bits, mode, transpose):
    """out (entries, M, N) float32: entry i is matrix ``x_idx[i]`` of x times matrix
    ``w_sel[i]`` of w."""
    f32 = xp.float32
    x = xp.ascontiguousarray(x.astype(f32) if x.ndim >= 2 else x.astype(f32).reshape(1, -1))
    w = xp.ascontiguousarray(w)
    s = xp.ascontiguousarray(scales.astype(f32) if mode == "affine"
                             else fp_scale(xp, scales, group_size))
    bb = xp.ascontiguousarray(b.astype(f32)) if b is not None else xp.zeros((1, 1), f32)
    M, K = x.shape[-2], x.shape[-1]
    N = w.shape[-2] if transpose else w.shape[-1] * 32 // bits
    x_offs = _offsets(xp, x, 4)[x_idx]

    def sel(a, unit):
        offs = _offsets(xp, a, unit)
        return offs[w_sel] if len(offs) > 1 else np.zeros(len(w_sel), np.int64) + offs[0]

    nb = len(x_idx)
    offs = [xp.asarray(o) for o in (x_offs, sel(w, 1), sel(s, 4), sel(bb, 4))]
    out = xp.empty((nb, M, N), f32)
    spec = QuantSpec("qmv_t", "affine" if mode == "affine" else "table", bits)
    ints = [np.int64(v) for v in (nb, M, N, K, group_size)]
    args = (x, w, s, bb, _table(xp, mode, bits), out, *offs, *ints)
    if transpose and M <= MAX_ROWS:
        grid = ((N + WARPS - 1) // WARPS, M, nb)
        _kernel(spec, True, False)(grid, (32 * WARPS,), args)
    else:
        grid = ((N + TILE - 1) // TILE, (M + TILE - 1) // TILE, nb)
        _kernel(spec, transpose, True)(grid, (TILE, TILE), args)
    return out


def quantized_matmul(xp, x, w, scales, *biases, group_size, bits, mode, transpose):
    b = biases[0] if biases else None
    if x.ndim <= 2 < w.ndim:  # MLX's kernel reads w's first matrix for an unbatched x
        w, scales = w.reshape(-1, *w.shape[-2:])[0], scales.reshape(-1, *scales.shape[-2:])[0]
        b = None if b is None else b.reshape(-1, *b.shape[-2:])[0]
    nb = int(np.prod(x.shape[:-2], dtype=np.int64)) if x.ndim > 2 else 1
    idx = np.arange(nb)
    out = _launch(xp, x, w, scales, b, idx, idx, group_size=group_size, bits=bits, mode=mode,
                  transpose=transpose)
    n = out.shape[-1]
    return out.reshape(*x.shape[:-1], n)


def gather_qmm(xp, x, w, scales, *rest, group_size, bits, mode, transpose, left_sorted,
               right_sorted):
    *b, lhs, rhs = rest
    li = xp.asnumpy(lhs).reshape(-1).astype(np.int64)
    ri = xp.asnumpy(rhs).reshape(-1).astype(np.int64)
    nx = int(np.prod(x.shape[:-2], dtype=np.int64))
    nw = int(np.prod(w.shape[:-2], dtype=np.int64))
    if li.size and (li.min() < 0 or li.max() >= nx or ri.min() < 0 or ri.max() >= nw):
        raise IndexError("[gather_qmm] an index lies outside the batch")
    out = _launch(xp, x, w, scales, b[0] if b else None, li, ri, group_size=group_size,
                  bits=bits, mode=mode, transpose=transpose)
    return out.reshape(*lhs.shape, *out.shape[-2:])


# primitive name -> rule, for the definitions that name these kernels (PrimitiveDef.kernel)
RULES: dict = by_kernel({"quantized_matmul": quantized_matmul, "gather_qmm": gather_qmm})
