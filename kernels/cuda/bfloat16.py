"""bfloat16 arrays on the GPU: 16-bit storage that CuPy only ever sees as uint16.

CuPy has no bfloat16 dtype, so a device bfloat16 array is a ``BF16Array``: a CuPy uint16
array (``raw``) that reports the bfloat16 dtype to the core and has no
``__cuda_array_interface__`` (a CuPy function handed one raises instead of reading bits as
integers). MLX's CUDA backend keeps ``__nv_bfloat16`` storage and computes in float
(``mlx/backend/cuda/device/fp16_math.cuh``: each operator converts with
``__bfloat162float``, computes in float and rounds back with ``__float2bfloat16``, round to
nearest even); here a node reading or making bfloat16 takes one of three ways (``rule``):

- **elementwise** (unary, binary, ternary, ``AsType``): a one-op tape whose CUDA kernel the
  shared renderer writes with bfloat16 loads converted to float and stores rounded to
  nearest even (``codegen/cuda.py``'s ``half_load`` / ``half_store``), launched like a fused
  call (``compiled.kernel_for``). Without a kernel (no NVRTC, an op the dialect cannot
  spell) the array-module rule runs on float32 copies and the result is rounded as
  ml_dtypes rounds (``narrow``), recorded as a fallback;
- **data movement** (reshape, transpose, slices, gathers, concatenation, padding, copies,
  assigning scatters, ``Full``, ``View``, a file's ``Load``): the array-module rule on the
  uint16 storage, exactly the bits MLX's copy kernels move;
- **everything else** (reductions, matmul, scans, sorts, linear algebra, ...): the inputs
  widened to float32 (exact), the device's rule (CuPy, or the generated reduction kernels
  of ``cuda/reductions.py``), the bfloat16 outputs rounded to nearest even: float32
  accumulation, as MLX's reductions and its cuBLAS matmul (``CUBLAS_COMPUTE_32F``) do. Each
  such node is recorded on the timeline as a ``fallback`` with runtime ``cuda (float32)``
  and the reason.
"""

from __future__ import annotations

import hashlib
from typing import Any, Optional, Sequence

import cupy
import ml_dtypes
import numpy as np

from .. import timeline
from ..primitives import ASTYPE, REGISTRY

BF16 = np.dtype(ml_dtypes.bfloat16)
U16 = np.dtype(np.uint16)
F32 = np.dtype(np.float32)

THROUGH_FLOAT32 = ("bfloat16: CuPy has no bfloat16 and this primitive has no bfloat16 kernel, "
                   "so it runs on float32 copies of its inputs and rounds its bfloat16 "
                   "results to nearest even (float32 accumulation, as MLX's)")
NO_KERNEL = ("bfloat16: no CUDA kernel for this elementwise op here ({why}), so CuPy computes "
             "it in float32 and the result is rounded to nearest even")


class BF16Array:
    """A device bfloat16 array: ``raw`` is its CuPy uint16 storage (any strides). Its
    ``shape``, ``strides`` and ``data`` (the device pointer the kernels take) are the
    storage's, kept as slots: the eval loop's C part reads them per node (plan keys,
    launches) without a Python frame, as it reads a CuPy array's."""

    __slots__ = ("raw", "shape", "strides", "data")
    dtype = BF16
    itemsize = 2

    def __init__(self, raw: Any):
        self.raw = raw
        self.shape, self.strides, self.data = raw.shape, raw.strides, raw.data

    ndim = property(lambda self: self.raw.ndim)
    size = property(lambda self: self.raw.size)
    nbytes = property(lambda self: self.raw.nbytes)
    flags = property(lambda self: self.raw.flags)
    T = property(lambda self: BF16Array(self.raw.T))

    def __len__(self) -> int:
        return len(self.raw)

    def get(self, stream=None) -> np.ndarray:
        """The host copy, as a numpy bfloat16 array."""
        h = self.raw.get() if stream is None else self.raw.get(stream=stream)
        return np.asarray(h).view(BF16)

    def tobytes(self, order: str = "C") -> bytes:
        return self.raw.tobytes(order=order)

    def item(self) -> Any:
        return self.get().item()

    def __getitem__(self, key) -> "BF16Array":
        return BF16Array(self.raw[key])

    def reshape(self, *shape, order: str = "C") -> "BF16Array":
        return BF16Array(self.raw.reshape(*shape, order=order))

    def transpose(self, *axes) -> "BF16Array":
        return BF16Array(self.raw.transpose(*axes))

    def ravel(self, order: str = "C") -> "BF16Array":
        return BF16Array(self.raw.ravel(order=order))

    def copy(self, order: str = "C") -> "BF16Array":
        return BF16Array(self.raw.copy(order=order))

    def view(self, dtype=None) -> Any:
        dt = np.dtype(dtype) if dtype is not None else BF16
        return BF16Array(self.raw.view(U16)) if dt == BF16 else self.raw.view(dt)

    def astype(self, dtype, copy: bool = True, **kw) -> Any:
        """float32 lazily (``Widened``: the evaluator's upcast of an elementwise op's inputs,
        which the bfloat16 kernels read as bfloat16 storage); other types through float32,
        as MLX's cast goes."""
        dt = np.dtype(dtype)
        if dt == BF16:
            return self.copy() if copy else self
        if dt == F32:
            return Widened(self)
        return widen(self).astype(dt)

    def __repr__(self) -> str:
        return f"BF16Array(shape={self.shape}, strides={self.strides})"


class Widened:
    """``x.astype(float32)`` of a ``BF16Array``, made only when something reads it (then
    every attribute is the float32 device array's)."""

    __slots__ = ("src", "_value")
    dtype = F32

    def __init__(self, src: BF16Array):
        self.src, self._value = src, None

    shape = property(lambda self: self.src.shape)
    ndim = property(lambda self: self.src.ndim)
    size = property(lambda self: self.src.size)

    def value(self) -> Any:
        if self._value is None:
            self._value = widen(self.src)
        return self._value

    def __getattr__(self, name: str) -> Any:
        return getattr(self.value(), name)

    def __float__(self) -> float:
        return float(self.value())

    def __int__(self) -> int:
        return int(self.value())

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, key) -> Any:
        return self.value()[key]


def is_bf16(dtype: Any) -> bool:
    """Whether ``dtype`` (numpy, a core Dtype, a name) is bfloat16."""
    if dtype is None or isinstance(dtype, (bool, int, float, tuple, list, dict)):
        return False
    np_dt = getattr(dtype, "np", None)
    if np_dt is not None:
        return np_dt == BF16
    try:
        return np.dtype(dtype) == BF16
    except TypeError:
        return False


def empty(shape: Sequence[int], dtype: Any, order: str = "C") -> Any:
    """Fresh device memory of ``dtype``, bfloat16 too."""
    dt = np.dtype(dtype)
    if dt == BF16:
        return BF16Array(cupy.empty(tuple(shape), dtype=U16, order=order))
    return cupy.empty(tuple(shape), dtype=dt, order=order)


def upload(host: np.ndarray) -> BF16Array:
    """A host bfloat16 array on the device (on the current stream)."""
    return BF16Array(cupy.asarray(np.asarray(host, order="C").view(U16)))


def value(x: Any) -> Any:
    """An input as an array-module rule can take it: float32 for bfloat16."""
    if type(x) is Widened:
        return x.value()
    if type(x) is BF16Array:
        return widen(x)
    return x


def storage(x: Any) -> Any:
    """An input as its bits: bfloat16's uint16 storage, others themselves."""
    if type(x) is BF16Array:
        return x.raw
    if type(x) is Widened:
        return x.src.raw
    return x


# -- conversions: MLX's (and ml_dtypes') round to nearest even ------------------------------
def widen(b: BF16Array) -> Any:
    """float32 of bfloat16 storage (exact: the bits shifted up): the ``AsType`` kernel,
    else CuPy integer ops."""
    out = _kernel_call("AsType", [b], F32, ())
    if out is not None:
        return out
    u = b.raw.astype(np.uint32)
    u <<= np.uint32(16)
    return u.view(np.float32)


def narrow(f: Any) -> BF16Array:
    """bfloat16 of a float device array, rounded to nearest even as ml_dtypes rounds
    (NaN: sign | 0x7fc0; overflow to infinity): the ``AsType`` kernel, else CuPy ops."""
    if f.dtype != F32:
        f = f.astype(F32)
    out = _kernel_call("AsType", [f], BF16, ())
    if out is not None:
        return out
    u = cupy.ascontiguousarray(f).view(np.uint32)
    r = (u + (((u >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF))) >> np.uint32(16)
    nan = ((u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0)
    r = cupy.where(u & np.uint32(0x7FFFFFFF) > np.uint32(0x7F800000), nan, r)
    return BF16Array(r.astype(np.uint16).reshape(f.shape))


def cast(x: Any, dtype: Any) -> Any:
    """A device array (or a host one a rule made) as ``dtype``, bfloat16 included."""
    dt = np.dtype(dtype)
    if isinstance(x, np.ndarray) and type(x) is np.ndarray:  # a host result (a file's bytes)
        x = np.asarray(x, dtype=dt)
        return upload(x) if dt == BF16 else cupy.asarray(x)
    if type(x) is BF16Array:
        return x if dt == BF16 else x.astype(dt)
    if type(x) is Widened:
        x = x.value()
    if dt == BF16:
        return narrow(x)
    return x if x.dtype == dt else x.astype(dt)


# -- the one-op kernels ---------------------------------------------------------------------
_tapes: dict = {}  # (primitive, in dtypes, out dtype, scalars, params) -> its one-op tape


def elementwise_tape(prim: str, in_dtypes: Sequence, out_dtype: Any, scalars: Sequence[bool],
                     params: tuple = (), by_value: Sequence[bool] = ()):
    """The one-op tape of an eager elementwise primitive (``AsType``: the copy kernel), as
    MLX has one unary / binary / ternary / copy kernel per op and types; ``by_value``: per
    input, a host scalar the kernel takes as a parameter's value (``TapeInput.by_value``)."""
    from ..codegen.tape import one_op_tape

    by_value = tuple(bool(v) for v in by_value) or (False,) * len(in_dtypes)
    key = (prim, tuple(np.dtype(d).str for d in in_dtypes), np.dtype(out_dtype).str,
           tuple(scalars), params) + ((by_value,) if any(by_value) else ())
    tape = _tapes.get(key)
    if tape is None:
        tag = hashlib.sha1(repr(key).encode()).hexdigest()[:10]
        types = "".join(np.dtype(d).name for d in (*in_dtypes, out_dtype))
        tape = _tapes[key] = one_op_tape(prim, in_dtypes, out_dtype, scalars, params, by_value,
                                         name=f"ew_{prim}_{types}_{tag}")
    return tape


def _kernel_call(prim: str, arrays: list, out_dtype: Any, params: tuple) -> Optional[Any]:
    """The op's one-op kernel on device ``arrays`` into fresh memory, or None without one."""
    from . import compiled

    shape = tuple(np.broadcast_shapes(*[a.shape for a in arrays]))
    tape = elementwise_tape(prim, [a.dtype for a in arrays], out_dtype,
                            [a.ndim == 0 for a in arrays], params)
    if any(s == 0 for s in shape):
        return empty(shape, out_dtype)
    ln = compiled.kernel_for(tape, arrays, shape)
    if ln is None:
        return None
    out = empty(shape, out_dtype, order=ln.order)
    ln.call(arrays, (out,))
    return out


def _elementwise(name: str, ins: tuple, out_dtype: Any, kw: dict, note) -> Any:
    arrays = [x.src if type(x) is Widened else x for x in ins]
    cast_only = REGISTRY[name].family == ASTYPE
    params = () if cast_only else tuple(sorted(kw.items()))
    try:
        out = _kernel_call(name, arrays, out_dtype, params)
    except Exception as e:  # noqa: BLE001 - a tape the renderer refuses: the float32 way
        out, why = None, str(e)
    else:
        why = "NVRTC or the CUDA dialect has none"
    if out is not None:
        return out
    note(NO_KERNEL.format(why=why))
    if cast_only:
        return cast(ins[0], out_dtype)
    res = REGISTRY[name].rule(cupy, *[value(x) for x in ins], **kw)
    return cast(res, out_dtype)


# -- which way a node goes ------------------------------------------------------------------
def _moves(name: str, ins: tuple, kw: dict) -> bool:
    """The primitive only moves elements (``PrimitiveDef.moves``: its rule gives exactly
    MLX's bits on uint16 storage) and its inputs need no conversion."""
    if not REGISTRY[name].moves or kw.get("reduce", "none") not in ("none", None):
        return False
    for x in ins:  # a float input of another type would need a conversion: not movement
        t = type(x)
        if t is not BF16Array and t is not Widened and getattr(x, "dtype", F32).kind in "fc":
            return False
    return True


def rule(prim: Any, own: Any, node: Any):
    """The rule of ``node`` (which reads or makes bfloat16) on the GPU: ``own`` (the
    device's rule, or the definition's) taken one of the three ways above."""
    defn = prim.defn
    fn = own or defn.rule
    name = prim.name
    outs = [ref() for ref in node.outputs]
    out_dts = [np.dtype(d.dtype.np) if d is not None else None for d in outs]
    stream = prim.stream

    def note(why: str, t0: int = 0) -> None:
        if timeline.enabled:
            timeline.add("fallback", t0 or timeline.now(), timeline.now(), name=name,
                         node=node.id, stream=stream.index, device="gpu",
                         detail={"primitive": name, "why": why, "runtime": "cuda (float32)"})

    def run(xp, *ins, out=None, **kw):
        if defn.elementwise or defn.family == ASTYPE:
            return _elementwise(name, ins, out_dts[0], kw, note)
        if _moves(name, ins, kw):
            kw = {k: (U16 if is_bf16(v) else v) for k, v in kw.items()}
            raws = [storage(x) for x in ins]
            if out is not None:
                target = storage(out)
                res = fn(xp, *raws, out=target, **kw)
                if res is target:
                    return out
            else:
                res = fn(xp, *raws, **kw)
            return _wrap(res, out_dts)
        t0 = timeline.now() if timeline.enabled else 0
        kw = {k: (F32 if is_bf16(v) else v) for k, v in kw.items()}
        res = fn(xp, *[value(x) for x in ins], **kw)
        if isinstance(res, (tuple, list)):
            res = type(res)(_result(r, dt) for r, dt in zip(res, out_dts))
        else:
            res = _result(res, out_dts[0])
        note(THROUGH_FLOAT32, t0)
        return res

    return run


def _result(r: Any, dt: Optional[np.dtype]) -> Any:
    if dt is None:
        return r
    if dt == BF16 or (type(r) is np.ndarray and r.dtype == BF16):
        return cast(r, dt)
    return r


def _wrap(res: Any, out_dts: list) -> Any:
    """A movement rule's uint16 results as bfloat16 where the node's outputs are."""
    def one(r, dt):
        if dt is not None and dt == BF16 and type(r) is not BF16Array:
            return BF16Array(r if r.dtype == U16 else r.view(U16))
        return r

    if isinstance(res, (tuple, list)):
        return type(res)(one(r, dt) for r, dt in zip(res, out_dts))
    return one(res, out_dts[0])


def touches(node: Any) -> bool:
    """Whether a node reads or makes bfloat16."""
    for d in node.inputs:
        if d.dtype.name == "bfloat16":
            return True
    for ref in node.outputs:
        d = ref()
        if d is not None and d.dtype.name == "bfloat16":
            return True
    return False
