"""MLX's ``QuantizedMatmul`` and ``GatherQMM`` as generated CUDA (``codegen/quantized.py``'s
sources, compiled through CuPy's ``RawKernel``, which caches the cubins on disk).

Planned as the CPU's (``kernels/cpu/quantized.py``, MLX's ``qmm.cu`` dispatch): each matrix of
the broadcast or gathered batch is an offset into x, w, scales and biases; up to
``MAX_ROWS`` rows of a transposed product run ``qmv`` (a warp per output, MLX's
``qmv_kernel``), everything else each entry's weight matrix dequantized once into a float32
tile and multiplied by cuBLAS (the CPU's ``_qmm`` with BLAS).
Float32 compute, rounded once to the output type by the evaluator.
"""

from __future__ import annotations

import numpy as np

from ..codegen.quantized import MAX_ROWS, QuantSpec, cuda_source
from ..common.strides import batch_offsets
from ..primitives import by_kernel
from ..rules.quantized import FP4_LUT, fp8_decode, fp_scale

_kernels: dict = {}
WARPS = 4  # output rows per qmv block


def _kernel(spec: QuantSpec, dequant: bool = False):
    import cupy

    key = (spec.name, dequant)
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = cupy.RawKernel(cuda_source(spec, dequant),
                                           spec.name + ("_dequant" if dequant else ""))
    return k


def _offsets(xp, a, unit: int):
    return batch_offsets(a, unit)


_consts: dict = {}  # (device, what) -> a small device array made once (tables, offsets)


def _const(xp, key, make):
    """A small read-only device array made once per device and key (a call's uploads and
    small kernels cost more than the one-row product itself)."""
    key = (xp.cuda.runtime.getDevice(),) + key
    got = _consts.get(key)
    if got is None:
        if len(_consts) > 512:
            _consts.clear()
        got = make()
        xp.cuda.get_current_stream().synchronize()  # other streams may read it next
        _consts[key] = got
    return got


def _table(xp, mode: str, bits: int):
    if mode == "affine":
        return _const(xp, ("zeros",), lambda: xp.zeros((1, 1), xp.float32))
    if bits == 4:
        return _const(xp, ("fp4",), lambda: xp.asarray(FP4_LUT, dtype=xp.float32))
    return _const(xp, ("fp8",), lambda: xp.ascontiguousarray(
        fp8_decode(xp, xp.arange(256, dtype=xp.uint8))))


def _launch(xp, x, w, scales, b, x_idx, w_sel, *, group_size, bits, mode, transpose,
            gathered=False):
    """out (entries, M, N) float32: entry i is matrix ``x_idx[i]`` of x times matrix
    ``w_sel[i]`` of w."""
    f32 = xp.float32
    x = xp.ascontiguousarray(x.astype(f32, copy=False) if x.ndim >= 2
                             else x.astype(f32, copy=False).reshape(1, -1))
    w = xp.ascontiguousarray(w)
    s = xp.ascontiguousarray(scales.astype(f32, copy=False) if mode == "affine"
                             else fp_scale(xp, scales, group_size))
    bb = xp.ascontiguousarray(b.astype(f32, copy=False)) if b is not None else _table(xp, "affine", 0)
    M, K = x.shape[-2], x.shape[-1]
    N = w.shape[-2] if transpose else w.shape[-1] * 32 // bits

    def sel(a, unit):
        offs = _offsets(xp, a, unit)
        return offs[w_sel] if len(offs) > 1 else np.zeros(len(w_sel), np.int64) + offs[0]

    def uploads():
        return [xp.asarray(o) for o in (_offsets(xp, x, 4)[x_idx], sel(w, 1), sel(s, 4), sel(bb, 4))]

    nb = len(x_idx)
    spec = QuantSpec("qmv_t", "affine" if mode == "affine" else "table", bits)
    if not (transpose and M <= MAX_ROWS):
        return _dense(xp, x, w, s, bb, x_idx, sel, spec, M, N, K, nb, group_size, transpose)
    if gathered:
        offs = uploads()
    else:  # the batch's offsets follow from the shapes and strides alone: uploaded once
        offs = _const(xp, ("offsets", nb) + tuple((a.shape, a.strides) for a in (x, w, s, bb)),
                      uploads)
    out = xp.empty((nb, M, N), f32)
    ints = [np.int64(v) for v in (nb, M, N, K, group_size)]
    args = (x, w, s, bb, _table(xp, mode, bits), out, *offs, *ints)
    grid = ((N + WARPS - 1) // WARPS, M, nb)
    _kernel(spec)(grid, (32 * WARPS,), args)
    return out


def _dense(xp, x, w, s, bb, x_idx, sel, spec, M, N, K, nb, gs, transpose):
    """More rows than qmv takes (or w not transposed): each entry's weight matrix
    dequantized once into a float32 tile (again only where the next entry's differs) and
    multiplied with cuBLAS, as the CPU does with BLAS (``kernels/cpu/quantized.py``'s
    ``_qmm``)."""
    f32 = xp.float32
    x_offs = _offsets(xp, x, 4)[x_idx]
    w_offs, s_offs, b_offs = sel(w, 1), sel(s, 4), sel(bb, 4)
    R, C = (N, K) if transpose else (K, N)
    tile = xp.empty((R, C), f32)
    out = xp.empty((nb, M, N), f32)
    wb, sf, bf = w.view(xp.uint8).reshape(-1), s.reshape(-1), bb.reshape(-1)
    xf = x.reshape(-1)
    table = _table(xp, "affine" if spec.kind == "affine" else "fp", spec.bits)
    kern = _kernel(spec, dequant=True)
    block = 256
    grid = ((C + block - 1) // block, min(R, 65535))
    last = None
    for i in range(nb):
        key = (int(w_offs[i]), int(s_offs[i]), int(b_offs[i]))
        if key != last:
            kern(grid, (block,), (wb[key[0]:], sf[key[1]:], bf[key[2]:],
                                  table, tile, np.int64(R), np.int64(C), np.int64(gs)))
            last = key
        xm = xf[int(x_offs[i]): int(x_offs[i]) + M * K].reshape(M, K)
        xp.matmul(xm, tile.T if transpose else tile, out=out[i])
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
                  bits=bits, mode=mode, transpose=transpose, gathered=True)
    return out.reshape(*lhs.shape, *out.shape[-2:])


# primitive name -> rule, for the definitions that name these kernels (PrimitiveDef.kernel)
RULES: dict = by_kernel({"quantized_matmul": quantized_matmul, "gather_qmm": gather_qmm})
