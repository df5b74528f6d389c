"""MLX's CUDA ``gemv`` (one row times a transposed weight: ``x @ w.T``, the products of an
``nn.Linear`` in decoding) as one kernel text rendered twice: CUDA (``cuda/gemm.py``'s plan,
launched by the eval loop from C) and C (the same loops with the grid, its warps and lanes
walked in order: the stand-in driver's build of a packed launch, and the Kernels tab's C).

The mechanism is MLX's ``gemv_single`` / ``gemv_batched`` (mlx/backend/cuda/gemms/gemv.cu):
a block of ``WARPS`` warps, each warp one output column ``n`` (a row of the weight, unit
stride along K), its lanes striding over K, float32 products summed in float32 whatever the
storage type, a warp reduction, the result rounded once to the storage type. Where x's row,
the weight row and the weight's row stride are 16-byte aligned and K is a whole number of
16-byte vectors, a lane reads 16 bytes at a time (MLX's ``n_per_thread`` vector loads), else
one element at a time (a warp-uniform choice made per launch from the pointers).

One launch covers a batch: the grid is one dimension, ``B * ceil(N / WARPS)`` blocks; entry
``bb``'s x and weight start ``bb`` times their batch stride in (0: a broadcast operand), its
output row at ``bb * N``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .warp_text import c_head, c_prelude, cuda_prelude

WARPS = 8  # output columns (warps) per block
TYPES = ("float32", "float16", "bfloat16")
INTS = ("B", "N", "K", "w_rs", "x_bs", "w_bs")


@dataclass(frozen=True)
class GemvSpec:
    """One kernel: the storage type of x, the weight and the output (compile-time)."""

    dtype: str

    @property
    def name(self) -> str:
        return f"gemv_t_{self.dtype}"

    @property
    def layout(self) -> str:
        return f"gemv {self.dtype} (x @ w.T, one row)"

    lib_name = property(lambda self: self.name)

    def params(self) -> list:
        """(kind, name) in argument order: ``in`` / ``out`` pointers, then int64 values."""
        return [("in", "x"), ("in", "w"), ("out", "out")] + [("int", n) for n in INTS]

    def sources(self, built: dict) -> dict:
        """The Kernels tab's three: CUDA, its C build, and why there is no Metal one."""
        return {"cpu": built.get("cpu") or c_source(self),
                "cuda": built.get("cuda") or cuda_source(self),
                "metal": "// no MSL gemv kernel: Metal runs the matmul rule"}


# The kernel's text: the dialects define T, LOAD (a T as float), STORE (a float rounded to
# T), LOADW4 (16 bytes into four words), FROM_WORDS (element j of such words as float), the
# grid's loops (FOR_BLOCK_WARP, FOR_LANE), WARP_SUM and LEADER (lane 0 of the warp). In CUDA
# the loops run once per thread; in C they walk every block, warp and lane in order, the
# lanes' sums falling into one accumulator.
_BODY = """
#define WARPS {warps}
#define EPV (16 / (int)sizeof(T))  /* elements per 16-byte vector */

KERNEL_HEAD {{
  const long long nblk = (N + WARPS - 1) / WARPS;
  FOR_BLOCK_WARP(blk, warp) {{
    const long long bb = blk / nblk, n = (blk % nblk) * WARPS + warp;
    if (n < N) {{  /* warp-uniform */
      const T* xr = X + bb * x_bs;
      const T* wr = W + bb * w_bs + n * w_rs;
      const int vec = ((ADDR(xr) | ADDR(wr)) & 15) == 0 && K % EPV == 0 &&
                      ((w_rs * (long long)sizeof(T)) & 15) == 0;
      float acc = 0.0f;
      FOR_LANE(lane) {{
        if (vec) {{
          for (long long k0 = (long long)lane * EPV; k0 < K; k0 += 32 * EPV) {{
            uint32_t xw[4], ww[4];
            LOADW4(xw, xr + k0);
            LOADW4(ww, wr + k0);
            UNROLL
            for (int j = 0; j < EPV; j++) acc = fmaf(FROM_WORDS(xw, j), FROM_WORDS(ww, j), acc);
          }}
        }} else {{
          for (long long k = lane; k < K; k += 32) acc = fmaf(LOAD(xr[k]), LOAD(wr[k]), acc);
        }}
      }}
      acc = WARP_SUM(acc);
      LEADER {{ OUT[bb * N + n] = STORE(acc); }}
    }}
  }}
}}
"""

_BUFS = {"x": ("X", "const T*"), "w": ("W", "const T*"), "out": ("OUT", "T*")}


def _signature(spec: GemvSpec) -> str:
    return ", ".join(f"{_BUFS[n][1]} __restrict__ {_BUFS[n][0]}" if k != "int" else f"long long {n}"
                     for k, n in spec.params())


def _body(head: str) -> str:
    return _BODY.format(warps=WARPS).replace("KERNEL_HEAD {", head, 1)


def cuda_source(spec: GemvSpec) -> str:
    """The CUDA of ``spec``: ``WARPS * 32`` threads a block, a one-dimensional grid."""
    head = (f'extern "C" __global__ void __launch_bounds__({WARPS * 32}) '
            f"{spec.name}({_signature(spec)}) {{")
    return cuda_prelude(spec.dtype) + _body(head)


def c_source(spec: GemvSpec) -> str:
    """The C of ``spec``: the same loops over every block, warp and lane in order (the
    kernels' ``void** args`` entry: pointers, then the int64 values)."""
    return c_prelude(spec.dtype) + _body(c_head(spec.name, spec.params(), _BUFS))
