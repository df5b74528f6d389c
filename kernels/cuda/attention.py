"""MLX's ``ScaledDotProductAttention`` on an NVIDIA GPU.

Decoding (query length up to 8, MLX's ``sdpa_vector``): ``codegen/attention_cuda.py``'s
kernels, compiled by NVRTC through the fused kernels' cache (``compiled.get_kernel``:
memory, disk, ``kernel_cache()``), launched on the node's CUDA stream as MLX's CUDA backend
runs ``kernel_sdpav_1pass``, or for long caches ``kernel_sdpav_2pass_1`` / ``_2``
(mlx/backend/cuda/scaled_dot_product_attention.cu): the keys split into runs (how many:
``attention_cuda.splits`` from the key length, the device's SM count and the split kernel's
blocks an SM holds), each run's partial state to a float32 scratch, then their merge.
The kernels read the inputs through their strides with unit-stride head rows (others are
copied first, as MLX copies them); the mask (broadcast to (B, H, L, kL)) through its own.
Every decoding call runs a plan (``vector_plan``: a ``KernelPlan``, or for two passes a
``PlanSequence`` with its scratch per CUDA stream; the launches' words packed once, bfloat16
read in its own 16 bits). A layout that needs no copy is planned for its own inputs, so
later calls of that layout are launched by the eval loop from C (``primitive_plans.py``)
with no Python code, as MLX's ``sdpa_vector`` is one or two C++ launches; one that needs a
copy runs the rule, which copies and runs the plan of the copies' layout. The dispatch by
query length is ``RULES``'s one rule.

Longer queries (prefill) run one fused kernel (``codegen/attention_flash.py``: tiles of 64
query rows a CTA over key / value tiles in shared memory, the online softmax in registers,
``mma.sync`` on the tensor cores: TF32 for float32 where ``settings.tf32``, 3xTF32 (float32's
accuracy) where not, float16 / bfloat16 in their own 16 bits with float32 accumulation),
planned once per layout (``flash_plan``: a ``KernelPlan``, later calls launched by the eval
loop from C), on devices with ``mma.sync`` (sm_80 on), the kernel and tile ``FLASH`` names for
the call's precision and head size (float16 / bfloat16: ``codegen/attention_flash16.py``'s
ldmatrix / cp.async kernel), inputs it reads in place (``attention.call_in_place``); a float32
plan is dropped when ``settings.tf32`` changes. The other prefill calls (a head size it does
not take, a layout the kernel would need a copy of, an older GPU) run MLX's fallback
composition as its CUDA backend runs it for float32 (mlx/fast.cpp: ``matmul``, ``softmax(precise=True)``, ``matmul``; cuDNN's fused
attention takes the half types there): in blocks of query rows holding at most ``SCORES``
float32 scores, the block's scores ``q kᵀ * scale`` as one cuBLAS
``gemmStridedBatchedEx`` (``gemm.strided_batched``: the scale as alpha, the query heads of
one key head through the batch strides, no repeated keys), the score softmax in place
(``codegen/attention_softmax.py``: one launch, the masks and sinks applied inside it), then
``p v`` as a second GEMM into the output's rows. Float32 GEMMs run in TF32 where
``settings.tf32`` (MLX_ENABLE_TF32), as MLX's matmuls; float16 and bfloat16 keep their
values in their 16 bits (bfloat16 as ``BF16Array`` storage: float32 scores and accumulation,
``p`` rounded to the inputs' type for ``p v`` as cuDNN rounds it; decoding's rule path
(a copy first) reads float32 copies of bfloat16, ``bfloat16.rule``'s way). Float64, an empty input, a CuPy
without cuBLAS bindings or a softmax kernel without a build run the array-module rule
(``rules/fast.py``, blocks of query rows, two matmuls and the softmax passes per block),
recorded as a ``kernel_fallback`` with the reason; so does a decoding call the vector kernel
does not take (a head size above 256).
"""

from __future__ import annotations

import numpy as np

from .. import timeline
from ..codegen import attention_flash
from ..codegen.attention_cuda import (BLOCKS_PER_SM, SPLIT_KEYS, SPLIT_THREADS, block_threads,
                                      params, splits, takes, vector_source)
from ..codegen.attention_kernels import VECTOR_MAX_L, SdpaSpec
from ..codegen.attention_softmax import MASK_INTS, ScoresSoftmaxSpec
from ..common import attention
from ..common.norms import elem_strides
from .. import kernel_registry
from ..primitives import REGISTRY, by_kernel
from . import bfloat16 as bf16, compiled, gemm
from ..kernel_call import KernelRule
from ..settings import settings
from .primitive_plans import SCRATCH, KernelPlan, PlanSequence, fits
from .reductions import step_for

SCORES = 1 << 28  # float32 scores of one query block (1 GiB): one block for most prompts
NAME = "ScaledDotProductAttention"


def _bf16(ins) -> bool:
    for x in ins:
        if type(x) is bf16.BF16Array or type(x) is bf16.Widened:
            return True
    return False


def _composed(xp, ins, kw, why=None):
    t0 = timeline.now() if timeline.enabled and why else 0
    if _bf16(ins):  # bfloat16 through float32 copies, rounded once (bfloat16.rule's way)
        out = bf16.narrow(REGISTRY[NAME].rule(xp, *[bf16.value(x) for x in ins],
                                              scores=SCORES, **kw))
    else:
        out = REGISTRY[NAME].rule(xp, *ins, scores=SCORES, **kw)
    if t0:
        timeline.add("kernel_fallback", t0, timeline.now(), name=NAME, device="gpu",
                     detail={"reason": why, "runtime": "cupy", "primitive": NAME})
    return out


def _unit_rows(a):
    import cupy

    st = elem_strides(a)
    return a if st is not None and st[-1] == 1 else cupy.ascontiguousarray(a)


def rule(xp, q, k, v, *rest, out=None, scale, causal, has_mask, has_sinks):
    """The vector kernel for decoding, else the prefill's GEMMs and score softmax (``out``:
    the evaluator's buffer, unused: the vector plan writes a fresh one)."""
    import cupy

    kw = dict(scale=scale, causal=causal, has_mask=has_mask, has_sinks=has_sinks)
    ins = (q, k, v, *rest)
    if q.shape[2] > VECTOR_MAX_L:
        return _prefill(xp, ins, kw)
    if _bf16(ins):  # the vector kernel reads float32 copies, its result rounded once
        return bf16.narrow(rule(xp, *[bf16.value(x) for x in ins], **kw))
    why = attention.why_not(q, k, v)
    if why:
        return _composed(xp, ins, kw, why)
    q, k, v = _unit_rows(q), _unit_rows(k), _unit_rows(v)
    rest = list(rest)
    if has_mask:
        mask = rest[0]
        if mask.dtype != np.bool_ and mask.dtype != q.dtype:
            mask = mask.astype(q.dtype)
        if elem_strides(mask) is None:
            mask = cupy.ascontiguousarray(mask)
        rest[0] = mask
    if has_sinks:
        rest[-1] = cupy.ascontiguousarray(rest[-1].astype(q.dtype, copy=False))
    ins = (q, k, v, *rest)
    plan = RULES[NAME].planned(ins, kw)  # (the copies' layout: planned once too)
    if plan is None:
        return _composed(xp, ins, kw, f"no CUDA attention kernel for head size {q.shape[-1]} "
                                      f"in {q.dtype.name}")
    out = cupy.empty(plan.out_shape, dtype=plan.out_dtype)
    plan(*ins, out)
    return out


def _gemm_rows(a):
    """``a`` with unit-stride rows and row / head / batch strides cuBLAS takes (a leading
    dimension at least the row's length, none negative), copied row-major otherwise."""
    import cupy

    if type(a) is bf16.Widened:
        a = bf16.BF16Array(bf16.storage(a))
    st = elem_strides(a)
    if (st is None or st[-1] != 1 or (a.shape[-2] > 1 and st[-2] < a.shape[-1])
            or min(st) < 0):
        if type(a) is bf16.BF16Array:
            return bf16.BF16Array(cupy.ascontiguousarray(a.raw))
        return cupy.ascontiguousarray(a)
    return a


def _batches(B: int, Hk: int, strides: list) -> list:
    """The GEMM calls over the (batch, key head) pairs: ``(first offsets, count, strides)``
    each, one call where every operand's batch stride is its key-head stride times ``Hk``
    (or either count is 1), else one call per batch element (``strides``: each operand's
    (batch stride, key-head stride) in elements)."""
    if Hk == 1:
        return [([0] * len(strides), B, [sb for sb, _ in strides])]
    if B == 1 or all(sb == Hk * sh for sb, sh in strides):
        return [([0] * len(strides), B * Hk, [sh for _, sh in strides])]
    return [([b * sb for sb, _ in strides], Hk, [sh for _, sh in strides]) for b in range(B)]


def _entry(spec, step):
    """The score softmax's loaded kernel (every block's step runs the same one), or why it
    has none (the kernel cache's fallback noted)."""
    try:
        if isinstance(step, tuple):  # (spec, why the dialect cannot express it)
            raise kernel_registry.BuildError(step[1])
        return step.entry()
    except kernel_registry.BuildError as e:
        kernel_registry.note_fallback(spec.name, spec.layout, "", str(e), tape=spec)
        return str(e)


class _Prefill:
    """The launches of one prefill layout, made once (``_plans``): the score softmax's
    spec and ``Step`` per query block, and each GEMM's arguments with its pointers as
    (buffer, byte offset) pairs (buffers: q, k, v, scores, p, out); a call allocates the
    scores and the output and adds their addresses."""

    __slots__ = ("spec", "steps", "ops", "n_scores", "dtype", "out_shape", "compute")

    def __init__(self, dt, q_shape, qs, k_shape, ks, v_shape, vs, spec, mst, scale):
        B, H, L, D = q_shape
        Hk, kL, Dv = k_shape[1], k_shape[2], v_shape[3]
        reps = H // Hk
        bl = max(1, min(L, SCORES // (B * H * kL)))
        self.spec, self.dtype, self.out_shape = spec, dt, (B, H, L, Dv)
        self.n_scores = B * H * bl * kL
        t_in, t_s = gemm.data_type(dt), gemm.data_type(np.float32)
        it = dt.itemsize
        ldq = qs[2] if L > 1 else D
        ldk = ks[2] if kL > 1 else D
        ldv = vs[2] if kL > 1 else Dv
        self.steps, self.ops = [], []
        for i0 in range(0, L, bl):
            n = min(bl, L - i0)
            ints = {"rows": B * H * n, "cols": kL, "bl": n, "heads": H, "qoff": i0 + kL - L}
            if mst is not None:
                ints.update(zip(MASK_INTS, (i0 * mst[2],) + tuple(mst)))
            step = step_for(spec, ints, NAME)
            self.steps.append(step)
            # the query heads of a key head as one matrix of reps * L rows where stacked
            whole = n == L and reps > 1 and qs[1] == L * ldq
            groups = [(0, reps * n)] if whole or reps == 1 else [(r, n) for r in range(reps)]
            for r, rows in groups:  # scores = scale * q kᵀ (column-major: k q^T)
                q0, s0 = r * qs[1] + i0 * qs[2], r * n * kL
                for (oq, ok, os_), count, (sq, sk, ss) in _batches(
                        B, Hk, [(qs[0], reps * qs[1]), (ks[0], ks[1]), (H * n * kL, reps * n * kL)]):
                    self.ops.append((True, False, kL, rows, D, scale, (1, ok * it), t_in, ldk, sk,
                                     (0, (q0 + oq) * it), t_in, ldq, sq, (3, (s0 + os_) * 4), t_s,
                                     kL, ss, count))
            self.ops.append(step)
            for r, rows in groups:  # out = p v (column-major: v^T p^T)
                s0, o0 = r * n * kL, (r * L + i0) * Dv
                for (ov, op_, oo), count, (sv, sp_, so) in _batches(
                        B, Hk, [(vs[0], vs[1]), (H * n * kL, reps * n * kL), (H * L * Dv, reps * L * Dv)]):
                    self.ops.append((False, False, Dv, rows, kL, 1.0, (2, ov * it), t_in, ldv, sv,
                                     (4, (s0 + op_) * it), t_in, kL, sp_, (5, (o0 + oo) * it),
                                     t_in, Dv, so, count))

    def __call__(self, q, k, v, bufs: dict, entry):
        import cupy

        dt = self.dtype
        st = bf16.U16 if dt == bf16.BF16 else dt  # the storage (bfloat16's bits as uint16)
        scores = cupy.empty(self.n_scores, dtype=cupy.float32)
        probs = scores if dt == np.float32 else cupy.empty(self.n_scores, dtype=st)
        out = cupy.empty(self.out_shape, dtype=st)
        bufs["x"], bufs["out"] = scores, probs
        base = (q.data.ptr, k.data.ptr, v.data.ptr, scores.data.ptr, probs.data.ptr, out.data.ptr)
        compute = gemm.compute_type(dt)  # (TF32 as the setting is now)
        for op in self.ops:
            if type(op) is tuple:
                (ta, tb, m, n, kk, alpha, (ai, ao), at, lda, sa, (bi, bo), bt, ldb, sb,
                 (ci, co), ct, ldc, sc, count) = op
                gemm.strided_batched(ta, tb, m, n, kk, alpha, base[ai] + ao, at, lda, sa,
                                     base[bi] + bo, bt, ldb, sb, base[ci] + co, ct, ldc, sc,
                                     count, compute)
            else:
                op.run(entry, bufs, {})
        return bf16.BF16Array(out) if dt == bf16.BF16 else out


_plans: dict = {}  # a prefill layout -> its _Prefill


def _prefill(xp, ins, kw):
    """Attention for query lengths past the vector kernel's: per block of query rows, the
    scores GEMM, the score softmax kernel, the ``p v`` GEMM (see the module's docstring),
    planned once per layout."""
    import cupy

    q, k, v, *rest = ins
    dt = q.dtype
    if dt != np.float32 and dt != np.float16 and dt != bf16.BF16:
        return _composed(xp, ins, kw, f"no cuBLAS attention for {dt.name} values")
    if not gemm.available():
        return _composed(xp, ins, kw, "no cuBLAS bindings in this CuPy")
    if 0 in q.shape or 0 in k.shape or 0 in v.shape:
        return _composed(xp, ins, kw, "an empty input")
    mask = rest[0] if kw["has_mask"] else None
    kind, mdt, mst = "none", "", None
    if mask is not None:
        kind = "bool" if mask.dtype == np.bool_ else "add"
        if type(mask) is bf16.Widened:
            mask = bf16.BF16Array(bf16.storage(mask))
        if kind == "add" and mask.dtype not in (np.float32, np.float16, bf16.BF16):
            mask = mask.astype(np.float32)
        mdt = "" if kind == "bool" else mask.dtype.name
        mst = elem_strides(mask)
        if mst is None:
            mask = cupy.ascontiguousarray(mask)
            mst = elem_strides(mask)
    q, k, v = _gemm_rows(q), _gemm_rows(k), _gemm_rows(v)
    qs, ks, vs = elem_strides(q), elem_strides(k), elem_strides(v)
    key = (dt, q.shape, qs, k.shape, ks, v.shape, vs, kind, mdt, mst, kw["causal"],
           kw["has_sinks"], kw["scale"], SCORES)
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) > 256:
            _plans.clear()
        spec = ScoresSoftmaxSpec(dt.name, kind, mdt, bool(kw["causal"]), bool(kw["has_sinks"]))
        plan = _plans[key] = _Prefill(np.dtype(dt), q.shape, qs, k.shape, ks, v.shape, vs,
                                      spec, mst, kw["scale"])
    entry = _entry(plan.spec, plan.steps[0])  # before the first GEMM: else the rule runs
    if isinstance(entry, str):
        return _composed(xp, ins, kw, entry)
    bufs = {}
    if mask is not None:
        bufs["mask"] = bf16.storage(mask)
    if kw["has_sinks"]:
        bufs["sinks"] = cupy.ascontiguousarray(bf16.value(rest[-1]).astype(cupy.float32))
    return plan(q, k, v, bufs, entry)


rule.takes_bfloat16 = True  # cuda/backend.py: bfloat16 inputs come as BF16Arrays


class _Step:
    """One attention kernel's launch as ``KernelPlan`` reads a ``reductions.Step``: its grid
    and block, its arguments in the signature's order (``sig``: (kind, name) pairs; int64
    values; the scale as its float32 bits in the word's low four bytes, which the kernel's
    ``float`` parameter reads; None where a buffer goes) and where each buffer goes.
    ``vector`` makes a decoding kernel's (``attention_cuda``'s block and signature)."""

    __slots__ = ("spec", "grid", "block", "args", "bufs", "arrays")

    def __init__(self, spec, sig, ints: dict, grid: int, block: int, scale: float):
        self.spec, self.grid, self.block = spec, int(grid), int(block)
        self.args, self.bufs, self.arrays = [], [], []
        for i, (kind, name) in enumerate(sig):
            if kind in ("in", "out"):
                self.bufs.append((i, name))
                self.args.append(None)
            elif kind == "int":
                self.args.append(int(ints[name]))
            else:
                self.args.append(int(np.float32(scale).view(np.uint32)))

    @classmethod
    def vector(cls, spec, ints: dict, grid: int, scale: float) -> "_Step":
        return cls(spec, params(spec), ints, grid, block_threads(spec), scale)


def _built(spec, source=vector_source):
    """``spec``'s loaded kernel (its CUDA ``source(spec)``), or None where it does not build
    (the cache notes why)."""
    try:
        return compiled.get_kernel(spec.name, spec.layout, lambda: source(spec),
                                   key=spec.name, tape=spec)
    except kernel_registry.BuildError as e:
        kernel_registry.note_fallback(spec.name, spec.layout, "", str(e), tape=spec)
        return None


_sms: dict = {}  # device -> its SM count


def slots(entry) -> int:
    """First-pass blocks the device runs at once: its SMs (``multiProcessorCount``) times the
    blocks of ``entry``'s kernel an SM holds (``cuOccupancyMaxActiveBlocksPerMultiprocessor``;
    ``BLOCKS_PER_SM`` where this CuPy lacks the call)."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    sms = _sms.get(dev)
    if sms is None:
        sms = _sms[dev] = int(cupy.cuda.runtime.getDeviceProperties(dev)["multiProcessorCount"])
    per = 0
    compiled.current_context()
    try:
        per = int(cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
            compiled._function_ptr(entry.fn), SPLIT_THREADS, 0))
    except Exception:  # noqa: BLE001  (an older CuPy without the call, a driver refusing it)
        pass
    return sms * (per if per > 0 else BLOCKS_PER_SM)


def _blocks() -> int:
    """MLX_SDPA_BLOCKS's runs a row (0: unset, the device picks)."""
    raw = settings.sdpa_blocks
    if not raw:
        return 0
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"[settings] MLX_SDPA_BLOCKS={raw!r}: expected a positive integer.") from None
    return max(n, 0)


def vector_plan(q, k, v, *rest, scale, causal, has_mask, has_sinks):
    """Decoding's plan: the vector kernel's one launch (a ``KernelPlan``), or above
    ``SPLIT_KEYS`` keys the split keys' pass and the merge (a ``PlanSequence``, their
    partial states in its float32 scratch), the arguments packed once per layout and later
    calls launched by the eval loop from C; None where the rule copies first (head rows not
    unit-stride, an additive mask of another dtype, sinks not contiguous in the inputs'
    dtype), for prefill, or with no kernel. bfloat16 is read in its own 16 bits
    (``BF16Array`` storage; float32 math in the kernels)."""
    import cupy

    ins = (q, k, v, *rest)
    if q.shape[2] > VECTOR_MAX_L or any(type(a) is not cupy.ndarray and
                                        type(a) is not bf16.BF16Array for a in ins):
        return None
    call = attention.call_in_place(q, k, v, *rest, causal=causal, has_mask=has_mask,
                                   has_sinks=has_sinks)
    if call is None:
        return None
    spec = call.spec
    if not takes(spec):
        return None
    B, H, L, D = call.out_shape
    rows, kL = B * H * L, k.shape[2]
    inputs = {"q": 0, "k": 1, "v": 2}
    if has_mask:
        inputs["mask"] = 3
    if has_sinks:
        inputs["sinks"] = len(ins) - 1
    if kL > SPLIT_KEYS:  # two passes where the split kernels build and the device wants them
        first = SdpaSpec("vector_2pass_1", spec.dtype, D, spec.mask, bool(causal), bool(has_sinks))
        merge = SdpaSpec("vector_2pass_2", spec.dtype, D)
        e1 = _built(first)
        e2 = _built(merge) if e1 is not None else None
        n, chunk = splits(rows, kL, D, slots(e1), _blocks()) if e2 is not None else (1, kL)
        if n > 1:
            return PlanSequence(
                (_Step.vector(first, dict(call.ints, NB=n, chunk=chunk), rows * n, scale), e1,
                 dict(inputs, part=SCRATCH), None),
                [(_Step.vector(merge, {"rows": rows, "NB": n}, rows, scale), e2,
                  {"part": SCRATCH}, "out")],
                rows * n * (D + 2), np.float32, call.out_shape, call.out_dtype, NAME)
    entry = _built(spec)
    if entry is None:
        return None
    plan = KernelPlan(_Step.vector(spec, call.ints, rows, scale), entry, inputs, {},
                      call.out_shape, call.out_dtype, NAME)
    if not has_mask and kL <= SPLIT_KEYS:  # one plan for every cache length up to the split
        at = next(i for i, p in enumerate(params(spec)) if p == ("int", "kL"))
        plan.dims = ((1, 2, plan.offsets[at], SPLIT_KEYS),)
    return plan


_mma_devices: dict = {}  # device -> whether it runs mma.sync (sm_80 on)


def _has_mma() -> bool:
    import cupy

    try:
        dev = cupy.cuda.runtime.getDevice()
        got = _mma_devices.get(dev)
        if got is None:
            got = _mma_devices[dev] = int(cupy.cuda.Device(dev).compute_capability) >= 80
        return got
    except Exception:  # noqa: BLE001  (no device: the stand-in CuPy)
        return False


# Which prefill kernel runs, by (precision class, head size): a ``FlashSpec.tile`` (``""``:
# attention_flash's first loop; for float16 / bfloat16 a name of attention_flash16.TILES, the
# ldmatrix / cp.async kernel; for float32 ``qreload``, the first loop with the query fragments
# re-read each key tile: 128 / 167 registers at head 128 with TF32 / 3xTF32 against 206 / 255
# and spills) or None: the GEMM composition. Precision classes: ``half``
# (float16, bfloat16), ``tf32`` (float32 with settings.tf32), ``f32x3`` (float32 without).
# float32: the first loop for heads up to 64, measured on an H100 (BENCHMARKS.md, "The merged
# tree of 2026-12-07 (third session)"): at head 64 it beat the composition (TF32 (4, 16,
# 2048, 2048) 1.26 ms against 2.06, 8192 keys 14.4 against 26.4), at 128 it lost (2.97
# against 2.06; 45.7 against 28.4 at 8192; 3xTF32 6.08 against 4.29). The half types' tiles
# are not measured yet: benchmarks/sdpa_variants.py times every tile against the first loop,
# the composition and PyTorch on the GPU, and prints the entries to put here; until then they
# take FlashAttention-2's forward configurations (128 query rows a CTA of 4 warps: 64-key
# tiles at heads up to 64, 32-key tiles with the queries in shared memory at 128).
FLASH = {**{("half", h): ("w4m2k64" if h <= 64 else "w4m2k32q" if h == 128 else "w4m1k64")
            for h in attention_flash.HEADS},
         **{(p, h): ("" if h <= 64 else None) for p in ("tf32", "f32x3") for h in attention_flash.HEADS}}


def flash_tile(dtype: str, head: int):
    """The ``FLASH`` entry of a call (the float32 class from ``settings.tf32``), or None."""
    cls = "half" if dtype != "float32" else ("tf32" if settings.tf32 else "f32x3")
    return FLASH.get((cls, head))


def flash_heads(dtype: str) -> tuple:
    """The head sizes ``dtype`` runs the fused kernel for (under the current ``settings.tf32``)."""
    return tuple(h for h in attention_flash.HEADS if flash_tile(dtype, h) is not None)


def flash_plan(q, k, v, *rest, scale, causal, has_mask, has_sinks):
    """Prefill's plan: the fused kernel's one launch (a ``KernelPlan``; bfloat16 in its own
    16 bits), or None where the rule runs (a layout it would copy, a head size or device
    it does not take, no build)."""
    import cupy

    ins = (q, k, v, *rest)
    if any(type(a) is not cupy.ndarray and type(a) is not bf16.BF16Array for a in ins):
        return None
    if not _has_mma():
        return None
    call = attention.call_in_place(q, k, v, *rest, causal=causal, has_mask=has_mask,
                                   has_sinks=has_sinks)
    if call is None:
        return None
    sp = call.spec
    tile = flash_tile(sp.dtype, q.shape[-1])
    if tile is None:
        return None
    qs, ks, vs = (elem_strides(a) for a in (q, k, v))
    mst = tuple(call.ints[n] for n in attention_flash.MASK_PARAMS) if sp.mask != "none" else None
    spec, ints, grid, block = attention_flash.launch(
        sp.dtype, q.shape, qs, k.shape, ks, vs, sp.mask, mst, causal, has_sinks,
        "tf32" if settings.tf32 else "f32x3", tile)
    if not attention_flash.takes(spec):
        return None
    entry = _built(spec, attention_flash.flash_source)
    if entry is None:
        return None
    inputs = {"q": 0, "k": 1, "v": 2}
    if has_mask:
        inputs["mask"] = 3
    if has_sinks:
        inputs["sinks"] = len(ins) - 1
    return KernelPlan(_Step(spec, attention_flash.params(spec), ints, grid, block, scale), entry, inputs, {},
                      call.out_shape, call.out_dtype, NAME)


def plan(q, k, v, *rest, scale, causal, has_mask, has_sinks):
    """A call's plan: decoding's vector kernel, prefill's fused kernel."""
    kw = dict(scale=scale, causal=causal, has_mask=has_mask, has_sinks=has_sinks)
    if q.shape[2] > VECTOR_MAX_L:
        return flash_plan(q, k, v, *rest, **kw)
    return vector_plan(q, k, v, *rest, **kw)


def _empty(shape, dtype):
    import cupy

    if dtype == bf16.BF16:
        return bf16.BF16Array(cupy.empty(shape, dtype=bf16.U16))
    return cupy.empty(shape, dtype=dtype)


# primitive name -> rule, for the definition that names this kernel (PrimitiveDef.kernel):
# decoding's plans launched from C, every other call the rule (kernel_call.KernelRule)
RULES: dict = by_kernel({"attention": KernelRule(NAME, plan, rule, fits, _empty)})
# a decoding cache's keys and values grow each token: their length is the plan's per call
RULES[NAME].free = ((1, 2), (2, 2))


def _forget_float32_flash(_value) -> None:
    """Drop the float32 fused plans (their TF32 or 3xTF32 kernel is the setting's at plan
    time) when ``settings.tf32`` changes."""
    plans = RULES[NAME].plans
    for key in [k for k, p in plans.items() if p is not None
                and str(getattr(p, "name", "")).startswith("sdpa_flash_float32")]:
        del plans[key]


settings.watch("tf32", _forget_float32_flash)
