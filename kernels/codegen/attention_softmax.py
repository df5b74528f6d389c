"""The softmax of attention scores as a loop-IR kernel: the middle pass of
``ScaledDotProductAttention``'s prefill on a GPU (``kernels/cuda/attention.py``: the scores
``q kᵀ * scale`` from one cuBLAS GEMM, this kernel over each score row, then ``p v`` from a
second GEMM: MLX's fallback composition ``matmul``, ``softmax(precise=True)``, ``matmul`` of
``mlx/fast.cpp``, the scale taken by the first GEMM's alpha instead of a multiply of ``q``).

One group per score row, as ``reduce_kernels.py``'s GPU softmax (the same online softmax
monoid: running max and rescaled sum, merged across the block), the row's 16-byte vectors
kept in registers between its two passes where they fit (``Vec.cache``, as the norms: the
scores are read once and written once). The masks are applied inside the kernel, each
element's value as MLX's fallback makes it before its softmax: ``causal`` (query ``l`` of the
block sees keys ``c <= l + qoff``, ``qoff`` the block's first query plus ``kL - L``), a
boolean mask (False: float32's lowest, MLX's ``finfo.min``, so a row with every key masked
averages the values) and an additive one (added to the scaled score), read through the
mask's strides (broadcast to ``(B, H, L, kL)``; ``m0`` the block's first row). ``sinks``
(one float32 logit per head) join the max and the denominator and get no output.

The rows of a block are ``(b, h, l)`` in order (``bl`` query rows per head). The output
``p`` is the scores' buffer itself for float32 (each element read before it is written, by
the thread that writes it: the in-place softmax MLX's CUDA backend runs on a donated input),
a buffer of the inputs' half type otherwise (the second GEMM's operand, as cuDNN's attention
rounds ``p`` to the value type before ``p v``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .c_ops import Unsupported
from .ir_spec import IRKernelSpec
from .loop_ir import (INDEX, Cast, Fmt, Kernel, Let, Lit, Load, Math, Param, Range, Reduce,
                      Store, Vec, row_threads)
from .reduce_kernels import online_softmax

F32 = np.dtype(np.float32)
LOWEST = -3.4028234663852886e38  # finfo(float32).min: MLX's fallback's masked score
UNROLL = 4  # a thread's loads in flight along a row (reduce_kernels' GPU rows)
SLOTS = 4  # 16-byte vectors a thread keeps of its row: rows up to 16384 scores at 1024 threads
PAR_MIN = 1 << 15  # the CPU schedule (tests): rows run in parallel past this many scores
OUT_DTYPES = ("float32", "float16", "bfloat16")
MASK_DTYPES = ("bool", "float16", "bfloat16", "float32")


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


@dataclass(frozen=True)
class ScoresSoftmaxSpec(IRKernelSpec):
    """One score-softmax kernel: ``dtype`` (p's), ``mask`` (``none``, ``bool``, ``add``) and
    the mask's dtype, ``causal``, ``sinks``."""

    dtype: str
    mask: str = "none"
    mask_dtype: str = ""
    causal: bool = False
    sinks: bool = False

    @functools.cached_property  # (asked on every launch)
    def name(self) -> str:
        mask = {"none": "", "bool": "_boolmask", "add": f"_floatmask_{self.mask_dtype}"}[self.mask]
        return (f"sdpa_softmax_{self.dtype}{mask}" + ("_causal" if self.causal else "")
                + ("_sinks" if self.sinks else ""))

    @property
    def lib_name(self) -> str:  # what the kernel cache and the Kernels tab call it
        return self.name

    layout = "row"

    def kernel(self, gpu: bool = False) -> Kernel:
        return softmax_kernel(self)


INTS = ("rows", "cols", "bl", "heads", "qoff")
MASK_INTS = ("m0", "msb", "msh", "msl", "msk")


def softmax_kernel(spec: ScoresSoftmaxSpec) -> Kernel:
    """``out[r, c] = softmax_c(masked(x[r, c]))`` over ``rows`` rows of ``cols`` float32
    scores (row-major), each row ``r = (b * heads + h) * bl + l``."""
    if spec.dtype not in OUT_DTYPES or (spec.mask == "add" and spec.mask_dtype not in MASK_DTYPES):
        raise Unsupported(f"a score softmax into {spec.dtype}")
    dt = _dtype(spec.dtype)
    params = [Param("in", "x", F32)]
    if spec.mask != "none":
        params.append(Param("in", "mask", np.dtype(np.bool_) if spec.mask == "bool"
                            else _dtype(spec.mask_dtype)))
    if spec.sinks:
        params.append(Param("in", "sinks", F32))
    params.append(Param("out", "out", dt))
    params += [Param("int", n) for n in INTS + (MASK_INTS if spec.mask != "none" else ())]
    low = Lit(LOWEST, F32)

    def masked(v, i):
        """The element's score as its softmax sees it (MLX's fallback's order: causal, then
        the mask)."""
        e = v
        if spec.causal:
            e = Fmt(f"(({i}) <= lim ? {{0}} : {{1}})", (e, low))
        if spec.mask == "bool":
            e = Fmt("({1} ? {0} : {2})", (e, Load("mask", f"mrow + ({i}) * msk", np.dtype(np.bool_)), low))
        elif spec.mask == "add":
            e = Fmt("({0} + {1})", (e, Cast(F32, Load("mask", f"mrow + ({i}) * msk",
                                                       _dtype(spec.mask_dtype)))))
        return e

    row = [Let("l", INDEX, "r % bl"), Let("bh", INDEX, "r / bl"), Let("h", INDEX, "bh % heads")]
    if spec.causal:
        row.append(Let("lim", INDEX, "l + qoff"))
    if spec.mask != "none":
        row.append(Let("mrow", INDEX, "m0 + (bh / heads) * msb + h * msh + l * msl"))

    def fold(v, i):
        return [Let("v", F32, masked(Cast(F32, v), i))], {"v": "v"}

    stmts, elem = fold(Load("x", "r * cols + c", F32), "c")
    row.append(Reduce("c", 0, "cols", stmts, online_softmax(F32), "a", elem, unroll=UNROLL,
                      vec=Vec("x", "r * cols", F32, fold, cache="xs", slots=SLOTS)))
    if spec.sinks:  # the sink's logit in the max and the sum (MLX: a column of the scores)
        row += [Let("sk", F32, Load("sinks", "h", F32)),
                Let("mm", F32, "(sk > a_m ? sk : a_m)"),
                Let("den", F32, Fmt("a_s * {0} + {1}", (Math("exp", F32, ("a_m - mm",)),
                                                         Math("exp", F32, ("sk - mm",)))))]
    else:
        row += [Let("mm", F32, "a_m"), Let("den", F32, "a_s")]
    row.append(Let("inv", F32, Fmt("{0} / den", (Lit(1, F32),))))

    def scaled(v, i, aux=None):
        return [Let("o", F32, Fmt("{0} * inv", (Math("exp", F32, (Fmt("{0} - mm", (masked(Cast(F32, v), i),)),),
                                                     "nonpositive"),)))]

    body = scaled(Load("x", "r * cols + c", F32), "c") + [Store("out", "r * cols + c", "o", dt)]
    row.append(Range("c", 0, "cols", body, "threads", unroll=UNROLL,
                     vec=Vec("x", "r * cols", F32, scaled, cache="xs", slots=SLOTS,
                             store=("out", "r * cols", dt, "o"))))
    return Kernel(spec.name, params,
                  [Range("r", 0, "rows", row, "blocks", f"rows > 1 && rows * cols >= {PAR_MIN}")],
                  block=1024, groups=lambda v: min(v["rows"], 1 << 30),
                  threads=lambda v: row_threads(v["cols"]), wide=True)


def all_specs() -> list:
    """Every score-softmax kernel the prefill can ask for (the dialect tests render them)."""
    out = []
    for dt in OUT_DTYPES:
        for mask, mdt in [("none", ""), ("bool", "")] + [("add", m) for m in MASK_DTYPES[1:]]:
            for causal in (False, True):
                for sinks in (False, True):
                    out.append(ScoresSoftmaxSpec(dt, mask, mdt, causal, sinks))
    return out
