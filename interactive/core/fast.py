"""``mx.fast``: the fused layers.

``rms_norm``, ``layer_norm`` and ``rope`` record MLX's primitives (``RMSNorm``, ``LayerNorm``,
``RoPE``: generated kernels, ``kernels/codegen/norm_kernels.py``) and
``scaled_dot_product_attention`` MLX's ``ScaledDotProductAttention``, with MLX's inputs and
checks (``mlx/fast.cpp``); their ``*_fallback`` compositions are what MLX's jvp and vmap
transform. The others are composed from core ops as MLX's own fallbacks are (MLX defines
each in ``mlx/fast.cpp`` with a ``fallback`` lambda made of ordinary ops).
``metal_kernel`` is ``fast_metal.py``; ``cuda_kernel`` and ``precompiled_cuda_kernel`` are
``fast_cuda.py``.
"""

from __future__ import annotations

import math
from typing import Optional, Union

from tapescope.kernels.backends import existing_stream_backend

from . import dtypes as _dt
from .array import array
from .device import BadArgs, DeviceType, StreamContext, StreamOrDevice, binding, resolve_stream
from .primitive import Primitive
from .fast_cuda import cuda_kernel, precompiled_cuda_kernel  # noqa: F401 - mx.fast.cuda_kernel
from .fast_metal import metal_kernel  # noqa: F401 - mx.fast.metal_kernel


_ops: list = []  # tapescope.core.ops, once imported (it imports this module)


def _mx():
    if not _ops:
        from . import ops

        _ops.append(ops)
    return _ops[0]


def _float_out(name: str, *arrays) -> _dt.Dtype:
    ops = _mx()
    out = arrays[0].dtype
    for a in arrays[1:]:
        if a is not None:
            out = ops.result_type(out, a.dtype)
    if not _dt.issubdtype(out, _dt.floating):
        raise ValueError(f"[{name}] Received unsupported type {out.name}.")
    return out


def _check_vector(name: str, what: str, x: array, v: Optional[array]) -> None:
    if v is None:
        return
    if v.ndim != 1:
        raise ValueError(f"[{name}] {what} must have 1 dimension but has {v.ndim} dimensions.")
    if v.shape[0] != x.shape[-1]:
        raise ValueError(f"[{name}] {what} must have the same size as the last dimension of x "
                         f"but has {v.shape[0]} elements.")


def _check_input(name: str, x: array) -> None:
    if x.ndim == 0:
        raise ValueError(f"[{name}] Input must have at least 1 dimension but got input with "
                         "0 dimensions.")


def _as(x: array, dtype: _dt.Dtype, s) -> array:
    return x if x.dtype == dtype else _mx().astype(x, dtype, stream=s)


def rms_norm(x: array, weight: Optional[array], eps: float, *,
             stream: StreamOrDevice = None) -> array:
    """Root-mean-square normalization over the last axis, times ``weight``: MLX's ``RMSNorm``
    primitive (the statistics in float32, the result in the promoted type), its inputs ``x``
    and the weight cast to that type (MLX's scalar 1 without a weight)."""
    if x.__class__ is array and weight.__class__ is array:  # (an nn.RMSNorm's call)
        xd, wd = x._d, weight._d
        dt, sx, sw = xd.dtype, xd.shape, wd.shape
        if wd.dtype is dt and dt.kind in "fV" and sx and len(sw) == 1 and sw[0] == sx[-1]:
            # what the steps below record for them: no cast, no check that can fail
            return array._make1(sx, dt, Primitive("RMSNorm", resolve_stream(stream),
                                                  eps=float(eps)), [x, weight])
    _check_input("rms_norm", x)
    _check_vector("rms_norm", "(*weight)", x, weight)
    out_type = _float_out("rms_norm", x, weight)
    s = resolve_stream(stream)
    w = _as(weight, out_type, s) if weight is not None else array(1, out_type)
    return array._make1(tuple(x.shape), out_type, Primitive("RMSNorm", s, eps=float(eps)),
                        [_as(x, out_type, s), w])


def _rms_norm_fallback(x: array, w: array, eps: float) -> array:
    """MLX's composition of RMSNorm (``mlx/fast.cpp``'s ``fallback``), which its jvp and vmap
    transform: ``x`` in the output type, ``w`` MLX's weight input (0-d: none)."""
    mx = _mx()
    y = mx.astype(x, _dt.float32)
    y = y * mx.rsqrt(mx.mean(mx.square(y), -1, keepdims=True) + array(eps, _dt.float32))
    y = mx.astype(y, x.dtype)
    return y if w.ndim == 0 else mx.multiply(y, w)


def layer_norm(x: array, weight: Optional[array], bias: Optional[array], eps: float, *,
               stream: StreamOrDevice = None) -> array:
    """Layer normalization over the last axis, then ``* weight + bias`` where given: MLX's
    ``LayerNorm`` primitive over ``x``, weight and bias in the promoted type (its scalars 1 and
    0 for those not given)."""
    _check_input("layer_norm", x)
    _check_vector("layer_norm", "weight", x, weight)
    _check_vector("layer_norm", "bias", x, bias)
    out_type = _float_out("layer_norm", x, weight, bias) if weight is not None else \
        _float_out("layer_norm", x)
    s = resolve_stream(stream)
    w = _as(weight, out_type, s) if weight is not None else array(1, out_type)
    b = _as(bias, out_type, s) if bias is not None else array(0, out_type)
    return array._make1(tuple(x.shape), out_type, Primitive("LayerNorm", s, eps=float(eps)),
                        [_as(x, out_type, s), w, b])


def _layer_norm_fallback(x: array, w: array, b: array, eps: float) -> array:
    """MLX's composition of LayerNorm (``mlx/fast.cpp``): 0-d ``w`` / ``b``: none given."""
    mx = _mx()
    y = mx.astype(x, _dt.float32)
    centered = y - mx.mean(y, -1, keepdims=True)
    var = mx.mean(mx.square(centered), -1, keepdims=True)
    y = mx.astype(centered * mx.rsqrt(var + array(eps, _dt.float32)), x.dtype)
    if w.ndim:
        y = mx.multiply(y, w)
    if b.ndim:
        y = mx.add(y, b)
    return y


def rope(a: array, dims: int, *, traditional: bool, base: Optional[float], scale: float,
         offset: Union[int, array], freqs: Optional[array] = None,
         stream: StreamOrDevice = None) -> array:
    """Rotary positional encoding of the first ``dims`` features of the last axis, positions
    along the second-to-last axis starting at ``offset`` (MLX's ``RoPE`` primitive over the
    input, the offset as int32 and the frequencies as float32)."""
    if freqs is not None and base is not None:  # MLX's checks, in its order (mlx/fast.cpp)
        raise ValueError("[rope] Only one of base or freqs can have a value.")
    if freqs is None and base is None:
        raise ValueError("[rope] Neither base nor freqs has a value.")
    s = resolve_stream(stream)
    off = offset if isinstance(offset, array) else _int_offset(offset, s)
    if offset.__class__ is int and freqs is None and a.__class__ is array and dims.__class__ is int:
        ad = a._d  # (an nn.RoPE's call: _int_offset's one int32 element, no check that can fail)
        sh = ad.shape
        if len(sh) >= 3 and ad.dtype.kind in "fV" and 0 < dims <= sh[-1] and not dims % 2:
            return array._make1(sh, ad.dtype, Primitive(
                "RoPE", s, dims=dims, traditional=bool(traditional), base=float(base),
                scale=float(scale), forward=True), [a, off])
    _check_rope(a, dims, off, freqs)
    if off.dtype.size != 4:
        off = _mx().astype(off, _dt.int32, stream=s)
    inputs = [a, off] + ([_as(freqs, _dt.float32, s)] if freqs is not None else [])
    return _record_rope(inputs, s, dims=int(dims), traditional=bool(traditional),
                       base=float(base) if base is not None else 1.0, scale=float(scale),
                       forward=True)


_OFFSETS: dict = {}  # (stream index, offset, backend) -> RoPE's int32 offset on that GPU stream
_TABLE = 8192  # the offsets a device stream's table holds
_TABLES: dict = {}  # (stream, backend) -> the int32 offsets 0 .. _TABLE - 1 on that stream


def _int_offset(offset: int, s) -> array:
    """A Python int offset as RoPE's int32 input: on a device stream one element in the
    device's memory, kept per (stream, value, backend), so the call's kernel is launched from
    its plan with no upload (MLX's scalar reaches its CUDA kernel through unified memory): a
    one-element view (a Slice) of the stream's table of offsets, uploaded once, so a decoding
    loop's new offset each token costs no copy to the device; an offset past the table its
    own upload; the host scalar MLX makes (``array(offset, int32)``) elsewhere."""
    be = existing_stream_backend(s.index)  # (a stream that has run: its backend, if any)
    got = _OFFSETS.get((s.index, offset, be)) if be is not None else None
    if got is not None:  # a decoding loop's offset seen before: its view of the table
        return got
    if s.device.type != DeviceType.gpu:
        return array(offset, _dt.int32)
    import numpy as np

    from tapescope.kernels.backends import stream_backend

    try:
        be = stream_backend(s)
    except Exception:  # noqa: BLE001 - no device backend: the eval says so, as before
        return array(offset, _dt.int32)
    if be.array_type is np.ndarray:
        return array(offset, _dt.int32)
    key = (s.index, int(offset), be)  # (a stream is its index: Stream.__eq__)
    got = _OFFSETS.get(key)
    if got is None:
        if len(_OFFSETS) >= 1024:  # a decoding loop's growing offsets: a bounded few
            _OFFSETS.clear()
        offset = int(offset)
        if 0 <= offset < _TABLE:
            table = _TABLES.get((s, be))
            if table is None:
                table = _TABLES[(s, be)] = array._from_data(np.arange(_TABLE, dtype=np.int32),
                                                            _dt.int32, s)
            got = array._make1((1,), _dt.int32, Primitive(
                "Slice", s, start_indices=(offset,), end_indices=(offset + 1,), strides=(1,)),
                [table])
        else:
            got = array._from_data(np.array([offset], np.int32), _dt.int32, s)
        _OFFSETS[key] = got
    return got


def _record_rope(inputs: list, s, **params) -> array:
    """A ``RoPE`` node over ``[x, offset(, freqs)]`` on stream ``s`` (None: the default)."""
    x = inputs[0]
    return array._make1(tuple(x.shape), x.dtype,
                        Primitive("RoPE", s if s is not None else resolve_stream(None), **params),
                        inputs)


def _rope_fallback(x: array, offset: array, *freqs, dims: int, traditional: bool, base: float,
                  scale: float, forward: bool) -> array:
    """MLX's composition of RoPE (``mlx/fast.cpp``), which its vmap transforms."""
    mx = _mx()
    shape = x.shape
    if x.ndim == 3:
        x = mx.expand_dims(x, 1)
    elif x.ndim > 4:
        x = mx.flatten(x, 1, x.ndim - 3)
    B, N, T, D = x.shape
    t = x.dtype
    half = dims // 2
    off = offset
    if off.size > 1:
        off = mx.expand_dims(off, [-1, -2])
    pos = (mx.arange(T, dtype=_dt.float32) + off) * array(scale, _dt.float32)
    if freqs:
        inv = mx.reciprocal(freqs[0])
    else:
        inv = mx.exp(mx.arange(0, -half, -1, dtype=_dt.float32) * array(math.log(base) / half,
                                                                        _dt.float32))
    theta = mx.expand_dims(pos, -1) * inv
    cos, sin = mx.astype(mx.cos(theta), t), mx.astype(mx.sin(theta), t)

    def rot(x1, x2):
        if forward:
            return [x1 * cos - x2 * sin, x1 * sin + x2 * cos]
        return [x2 * sin + x1 * cos, x2 * cos - x1 * sin]

    if traditional:
        r = rot(x[..., 0:dims:2], x[..., 1:dims:2])
        out = mx.reshape(mx.concatenate([mx.expand_dims(o, -1) for o in r], -1), (B, N, T, dims))
        if dims < D:
            out = mx.concatenate([out, x[..., dims:]], -1)
    else:
        outs = rot(x[..., :half], x[..., half:dims])
        if dims < D:
            outs.append(x[..., dims:])
        out = mx.concatenate(outs, -1)
    return mx.reshape(out, shape)


def _check_rope(a: array, dims: int, offset: array, freqs: Optional[array]) -> None:
    """MLX's rope checks (mlx/fast.cpp), in its order and with its messages."""
    if a.ndim < 3:
        raise ValueError(f"[rope] Input must have at least 3 dimensions but got input with "
                         f"{a.ndim} dimensions.")
    if not _dt.issubdtype(a.dtype, _dt.floating):
        raise ValueError(f"[rope] Input must be a floating type but got {a.dtype.name}.")
    if offset.ndim > 1:
        raise ValueError("[rope] offset must have at most one dimension but has shape "
                         f"{_fmt(offset.shape)}.")
    if offset.size != 1 and offset.size != a.shape[0]:
        raise ValueError(f"[rope] offset must be a scalar or vector with {a.shape[0]} elements "
                         f"but has shape {_fmt(offset.shape)}.")
    if not _dt.issubdtype(offset.dtype, _dt.integer):
        raise ValueError(f"[rope] offset must be an integer but got type {offset.dtype.name}.")
    if dims <= 0:
        raise ValueError(f"[rope] dims must be positive but got {dims}.")
    if dims % 2 != 0:
        raise ValueError(f"[rope] dims must be even but got {dims}.")
    if dims > a.shape[-1]:
        raise ValueError(f"[rope] dims must not exceed the input's last dimension "
                         f"({a.shape[-1]}) but got {dims}.")
    if freqs is not None and (freqs.ndim != 1 or freqs.shape[0] != dims // 2):
        raise ValueError(f"[rope] freqs must be one dimensional with size {dims // 2} but got "
                         f"shape {_fmt(freqs.shape)}.")


def _fmt(shape: tuple) -> str:
    return "(" + ",".join(str(d) for d in shape) + ")"


SDPA_MAX_HEAD_DIM = 256  # head sizes the ScaledDotProductAttention kernels take (MLX's largest)


def scaled_dot_product_attention(q: array, k: array, v: array, *, scale: float,
                                 mask: Union[None, str, array] = None,
                                 sinks: Optional[array] = None, force_fused: bool = False,
                                 stream: StreamOrDevice = None) -> array:
    """softmax(q kᵀ · scale + mask) v over (B, heads, L, D) inputs, with grouped-query heads
    (``k`` / ``v`` with fewer heads) and ``mask`` "causal", boolean or additive.

    MLX's inputs and checks (``mlx/fast.cpp``): q, k, v cast to their promoted floating type
    (the output's), an additive mask cast to it, every mask broadcast to (B, heads, L, kL),
    sinks cast to it. The inputs a kernel takes (a head size up to 256, the value's the
    query's, causal only with ``L <= kL``: MLX's fused kernels' conditions in
    ``backend/metal/scaled_dot_product_attention.cpp``) record MLX's
    ``ScaledDotProductAttention`` primitive; the others are MLX's fallback composition
    (``_sdpa_fallback``), which the primitive's vjp, jvp and vmap transform as MLX's
    ``Custom`` does. ``force_fused`` is accepted and changes nothing (each input has a path).
    """
    mx = _mx()
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError("[scaled_dot_product_attention] queries, keys and values must be 4D.")
    if isinstance(mask, str) and mask != "causal":
        raise ValueError(f"[scaled_dot_product_attention] Invalid mask_mode {mask}. "
                         "mask_mode must be 'causal' or empty string.")
    B, n_q, L, D = q.shape
    n_kv = k.shape[1]
    if n_q % n_kv != 0:
        raise ValueError(f"[scaled_dot_product_attention] n_heads must be a multiple of "
                         f"n_kv_heads, found n_heads {n_q} for n_kv_heads {n_kv}.")
    final = _dt.promote_types(_dt.promote_types(q.dtype, k.dtype), v.dtype)
    causal = isinstance(mask, str)
    has_mask = isinstance(mask, array)
    if has_mask and mask.ndim > 4:
        raise ValueError("[scaled_dot_product_attention] the mask with shape "
                         f"{_fmt(mask.shape)} expected to have at most rank 4.")
    if sinks is not None:
        if _dt.promote_types(sinks.dtype, final) != final:
            raise ValueError("[scaled_dot_product_attention] Type of sinks must promote to "
                             f"output type {final.name}.")
        if sinks.ndim != 1 or sinks.shape[0] != n_q:
            raise ValueError("[scaled_dot_product_attention] Received invalid shape for sinks "
                             f"{_fmt(sinks.shape)}.")
    fused = (_dt.issubdtype(final, _dt.floating) and q.shape[-1] == k.shape[-1]
             and k.shape[0] == B and v.shape[0] == B and v.shape[1] == n_kv
             and v.shape[2] == k.shape[2] and 0 < D <= SDPA_MAX_HEAD_DIM
             and v.shape[-1] == D and not (causal and L > k.shape[2])
             and (not has_mask or _dt.promote_types(mask.dtype, final) == final))
    if not fused:
        return _sdpa_composed(q, k, v, scale, mask, sinks, n_q, n_kv)
    s = resolve_stream(stream)
    inputs = [_as(q, final, s), _as(k, final, s), _as(v, final, s)]
    if has_mask:
        m = mask if mask.dtype == _dt.bool_ else _as(mask, final, s)
        inputs.append(mx.broadcast_to(m, (B, n_q, L, k.shape[2]), stream=s))
    if sinks is not None:
        inputs.append(_as(sinks, final, s))
    prim = Primitive("ScaledDotProductAttention", s, scale=float(scale), causal=causal,
                     has_mask=has_mask, has_sinks=sinks is not None)
    return array._make1((B, n_q, L, D), final, prim, inputs)


def _sdpa_fallback(q: array, k: array, v: array, *rest, scale: float, causal: bool,
                   has_mask: bool, has_sinks: bool) -> array:
    """MLX's fallback composition over the primitive's inputs (``mlx/fast.cpp``)."""
    mask = rest[0] if has_mask else ("causal" if causal else None)
    return _sdpa_composed(q, k, v, scale, mask, rest[-1] if has_sinks else None,
                          q.shape[1], k.shape[1])


def _sdpa_composed(q, k, v, scale, mask, sinks, n_q: int, n_kv: int) -> array:
    mx = _mx()
    B, _, L, D = q.shape
    reps = n_q // n_kv
    qs = q * array(scale, q.dtype)
    if reps > 1:
        qs = mx.reshape(qs, (B, n_kv, reps, L, D))
        k, v = mx.expand_dims(k, 2), mx.expand_dims(v, 2)
    scores = mx.matmul(qs, mx.swapaxes(k, -1, -2))
    kL = k.shape[-2]
    if mask is not None:
        if isinstance(mask, str):
            qi = mx.expand_dims(mx.arange(kL - L, kL), -1)
            m = qi >= mx.arange(kL)
        else:
            m = mask
            if reps > 1 and m.ndim >= 3:
                if m.shape[-3] == 1:
                    m = mx.expand_dims(m, -3)
                else:
                    m = mx.unflatten(m, -3, (n_kv, reps))
        if m.dtype == _dt.bool_:
            scores = mx.where(m, scores, array(_dt.finfo(scores.dtype).min, scores.dtype))
        else:
            scores = scores + m
    if sinks is not None:
        s = mx.reshape(mx.astype(sinks, scores.dtype), (1, n_kv, reps, 1, 1) if reps > 1
                       else (1, n_q, 1, 1))
        s = mx.broadcast_to(s, (*scores.shape[:-1], 1))
        scores = mx.softmax(mx.concatenate([s, scores], -1), -1, precise=True)[..., 1:]
    else:
        scores = mx.softmax(scores, -1, precise=True)
    out = mx.matmul(scores, v)
    if reps > 1:
        out = mx.reshape(out, (B, n_q, L, v.shape[-1]))
    return out


def cross_entropy(logits: array, targets: array, *, stream: StreamOrDevice = None) -> array:
    """logsumexp(logits) - logits[target] over the last axis (class-index targets)."""
    mx = _mx()
    if tuple(targets.shape) != tuple(logits.shape[:-1]):
        fmt = lambda s: "(" + ",".join(str(d) for d in s) + ")"  # noqa: E731  (MLX's format)
        raise ValueError(f"[cross_entropy] targets shape {fmt(targets.shape)} does not match "
                         f"logits shape {fmt(logits.shape)} with the last axis removed.")
    picked = mx.take_along_axis(logits, mx.expand_dims(targets, -1), -1)
    lse = mx.logsumexp(logits, -1, keepdims=True)
    return mx.squeeze(mx.astype(lse, _dt.float32) - mx.astype(picked, _dt.float32), -1)


_GDU_SIG = ("gated_delta_update(q: mlx.core.array, k: mlx.core.array, v: mlx.core.array, "
            "gamma: mlx.core.array, beta: mlx.core.array, initial_state: mlx.core.array | None "
            "= None, mask: mlx.core.array | None = None, stream: mlx.core.Stream | "
            "mlx.core.ThreadLocalStream | mlx.core.Device | mlx.core.DeviceType | None = None) "
            "-> list[mlx.core.array]")


def _step(x: array, t: int) -> array:
    """``x[:, t]`` as MLX's fallback takes it: a Slice of axis 1, then a Squeeze of axis 1
    (a 1-D ``x`` reaches the Squeeze, and its error, unsliced)."""
    mx = _mx()
    if x.ndim >= 2:
        x = x[:, t:t + 1]
    return mx.squeeze(x, 1)


@binding(_GDU_SIG)
def gated_delta_update(q: array, k: array, v: array, gamma: array, beta: array,
                       initial_state: Optional[array] = None, mask: Optional[array] = None,
                       stream: StreamOrDevice = None) -> list:
    """The gated delta rule, one time step after another, as MLX's fallback composes it.

    ``q``, ``k``: (B, T, Hk, Dk); ``v``: (B, T, Hv, Dv); ``gamma`` (decay, linear space):
    (B, T, Hv), or (B, T, Hv, Dk) for a decay per key channel; ``beta``: (B, T, Hv);
    ``initial_state``: (B, Hv, Dv, Dk) (zeros when None); ``mask``: (B, T), a false step keeps
    the state and outputs zeros. ``q`` / ``k`` heads repeat ``Hv // Hk`` times. Per step:
    ``S *= gamma; delta = (v - S k) * beta; S += delta kᵀ; y = S q``. Returns ``[y, state]``:
    ``y`` (B, T, Hv, Dv) in the type of ``q`` and ``k`` (float32 for integers), the state in
    float32 (float64 when ``q`` / ``k`` are). MLX checks no shapes: a mismatch surfaces as the
    error of the op that meets it, here as there.
    """
    mx = _mx()
    for x in (q, k, v, gamma, beta):
        if not isinstance(x, array):
            raise BadArgs("array")
    for x in (initial_state, mask):
        if x is not None and not isinstance(x, array):
            raise BadArgs("array")
    if q.ndim < 4 or v.ndim < 4:
        raise IndexError("SmallVector out of range.")
    with StreamContext(resolve_stream(stream)):
        dtype = mx.result_type(q.dtype, k.dtype)
        if not _dt.issubdtype(dtype, _dt.floating):
            dtype = _dt.float32
        q, k, v, gamma, beta = (mx.astype(x, dtype) for x in (q, k, v, gamma, beta))
        b, n_steps, hk, dk = q.shape[:4]
        hv, dv = v.shape[2], v.shape[3]
        state = (mx.zeros((b, hv, dv, dk), dtype=_dt.float32) if initial_state is None
                 else mx.astype(initial_state, _dt.float32))
        if mask is not None:
            mask = mx.astype(mask, _dt.bool_)
        reps = hv // hk if hk else 0
        if reps > 1:
            q, k = mx.repeat(q, reps, 2), mx.repeat(k, reps, 2)
        ys = []
        for t in range(n_steps):
            q_t, k_t, v_t, g_t, b_t = (_step(x, t) for x in (q, k, v, gamma, beta))
            m_t = None if mask is None else _step(mask, t)
            old = state
            decay = mx.expand_dims(g_t, (-2, -1)) if gamma.ndim == 3 else mx.expand_dims(g_t, -2)
            state = state * decay
            kv_mem = mx.sum(state * mx.expand_dims(k_t, -2), -1)
            delta = (v_t - kv_mem) * mx.expand_dims(b_t, -1)
            state = state + mx.expand_dims(k_t, -2) * mx.expand_dims(delta, -1)
            y_t = mx.sum(state * mx.expand_dims(q_t, -2), -1)
            if m_t is not None:
                state = mx.where(mx.expand_dims(m_t, (-3, -2, -1)), state, old)
                y_t = mx.where(mx.expand_dims(m_t, (-2, -1)), y_t, array(0, y_t.dtype))
            ys.append(y_t)
        return [mx.astype(mx.stack(ys, 1), dtype), state]
