"""A generated kernel's call planned once per layout (kernels/kernel_call.py, _kernel_call.c):
the eval loop's planned calls of reductions, RMSNorm / LayerNorm and RoPE against float64
numpy over hypothesis layouts (attention's too), bit for bit the same as the rule's unplanned path; one plan
per key, reused (the kernel's cache hits grow by one a call); the C and Python KernelCall
give the same bytes; recording the timeline changes only the records; a cleared kernel cache
drops the plans; bad calls raise clear errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx
from tapescope.core import evaluate
from tapescope.kernels import kernel_call as kc
from tapescope.kernels.backends import backend
from tapescope.kernels.common import norms
from tapescope.kernels.common.reductions import arguments
from conftest import requires_mlx
from tapescope.kernels.cpu import compiler

from conftest import kernel_launches as launched
from test_sdpa import ref as _sdpa_ref

needs_cc = pytest.mark.skipif(compiler.toolchain() is None, reason="no C compiler")
RULES = backend("cpu").kernel_rules


def _rms_ref(x, w, eps):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * w.astype(np.float64)


def _rope_ref(x, dims, base, offset):
    x64 = x.astype(np.float64)
    half = dims // 2
    L = x.shape[-2]
    inv = base ** (-np.arange(half) / half)
    theta = (offset + np.arange(L))[:, None] * inv[None, :]
    c, s = np.cos(theta), np.sin(theta)
    a, b = x64[..., :half], x64[..., half:dims]
    return np.concatenate([a * c - b * s, a * s + b * c, x64[..., dims:]], axis=-1)


def _slow(name, *ins, **kw):
    """The rule's unplanned path on numpy inputs (what ran before the plans)."""
    return RULES[name].slow(np, *ins, **kw)


@needs_cc
@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 9), cols=st.sampled_from([1, 3, 16, 33, 64]),
       transposed=st.booleans(), seed=st.integers(0, 2**16))
def test_planned_rms_norm_matches_numpy_and_the_unplanned_rule(rows, cols, transposed, seed):
    rng = np.random.default_rng(seed)
    xn = rng.standard_normal((cols, rows) if transposed else (rows, cols)).astype(np.float32)
    xn = xn.T if transposed else xn
    wn = rng.standard_normal(cols).astype(np.float32)
    x, w = mx.array(xn), mx.array(wn)
    if transposed:
        x = mx.transpose(mx.array(xn.T))
    mx.eval(x, w)
    for _ in range(3):  # the first call makes the plan, the next ones run it from the loop
        got = np.array(mx.fast.rms_norm(x, w, 1e-5))
        np.testing.assert_allclose(got, _rms_ref(xn, wn, 1e-5), rtol=2e-5, atol=2e-6)
        assert got.tobytes() == np.asarray(_slow("RMSNorm", np.array(x), wn, eps=1e-5)).tobytes()


@needs_cc
@settings(max_examples=15, deadline=None)
@given(heads=st.integers(1, 4), length=st.integers(1, 5), dims=st.sampled_from([8, 16]),
       offset=st.integers(0, 40), seed=st.integers(0, 2**16))
def test_planned_rope_matches_numpy_and_the_unplanned_rule(heads, length, dims, offset, seed):
    xn = np.random.default_rng(seed).standard_normal((1, heads, length, 16)).astype(np.float32)
    x = mx.array(xn)
    mx.eval(x)
    for _ in range(3):
        got = np.array(mx.fast.rope(x, dims, traditional=False, base=10000.0, scale=1.0,
                                    offset=offset))
        np.testing.assert_allclose(got, _rope_ref(xn, dims, 10000.0, offset), rtol=2e-4, atol=2e-5)
        slow = _slow("RoPE", xn, np.array(offset, np.int32), dims=dims, traditional=False,
                     base=10000.0, scale=1.0, forward=True)
        assert got.tobytes() == np.asarray(slow).tobytes()


@needs_cc
@settings(max_examples=10, deadline=None)
@given(L=st.sampled_from([1, 3, 33]), kL=st.sampled_from([5, 64, 70]), reps=st.sampled_from([1, 2]),
       mask=st.sampled_from([None, "causal", "bool", "additive"]), sinks=st.booleans(),
       transposed=st.booleans(), seed=st.integers(0, 2**16))
def test_planned_attention_matches_numpy_and_the_unplanned_rule(L, kL, reps, mask, sinks,
                                                                transposed, seed):
    rng = np.random.default_rng(seed)
    kL = max(kL, L)
    qn = rng.standard_normal((1, 2 * reps, L, 32)).astype(np.float32)
    kn, vn = (rng.standard_normal((1, 2, kL, 32)).astype(np.float32) for _ in range(2))
    mn = (rng.random((L, kL)) > 0.3 if mask == "bool" else
          rng.standard_normal((1, 2 * reps, L, kL)).astype(np.float32) if mask == "additive" else None)
    sn = rng.standard_normal(2 * reps).astype(np.float32) if sinks else None
    q = mx.swapaxes(mx.array(np.ascontiguousarray(qn.swapaxes(1, 2))), 1, 2) if transposed else mx.array(qn)
    k, v = mx.array(kn), mx.array(vn)
    m = "causal" if mask == "causal" else (mx.array(mn) if mn is not None else None)
    s = mx.array(sn) if sinks else None
    mx.eval(q, k, v)
    want = _sdpa_ref(qn, kn, vn, 0.3, mn, mask == "causal", sn)
    ins = (np.array(q), kn, vn) + ((np.broadcast_to(mn, (1, 2 * reps, L, kL)),) if mn is not None else ()) + \
        ((sn,) if sinks else ())
    kw = dict(scale=0.3, causal=mask == "causal", has_mask=mn is not None, has_sinks=sinks)
    slow = np.asarray(_slow("ScaledDotProductAttention", *ins, **kw))
    for _ in range(3):  # the first call makes the plan, the next ones run it
        got = np.array(mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3, mask=m, sinks=s))
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
        assert got.tobytes() == slow.tobytes()


@needs_cc
@settings(max_examples=15, deadline=None)
@given(shape=st.sampled_from([(5,), (3, 7), (4, 1, 6), (2, 3, 17)]), keepdims=st.booleans(),
       op=st.sampled_from(["sum", "max", "logsumexp", "argmax"]), seed=st.integers(0, 2**16))
def test_planned_reductions_match_numpy(shape, keepdims, op, seed):
    xn = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    x = mx.array(xn)
    mx.eval(x)
    ref = {"sum": lambda: xn.astype(np.float64).sum(-1, keepdims=keepdims),
           "max": lambda: xn.max(-1, keepdims=keepdims),
           "logsumexp": lambda: np.log(np.exp(xn.astype(np.float64)).sum(-1, keepdims=keepdims)),
           "argmax": lambda: xn.argmax(-1, keepdims=keepdims)}[op]()
    for _ in range(3):
        got = np.array(getattr(mx, op)(x, axis=-1, keepdims=keepdims))
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5)


@needs_cc
def test_one_plan_per_key_reused_from_the_loop():
    x = mx.array(np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32))
    w = mx.ones((32,))
    mx.eval(x, w)
    rule = RULES["RMSNorm"]
    mx.eval(mx.fast.rms_norm(x, w, 1e-4))  # makes the plan
    key = kc.plan_key("RMSNorm", (np.array(x), np.array(w)), {"eps": 1e-4})
    plan = rule.plans[key]
    assert isinstance(plan, kc.KernelCall)
    n = len(rule.plans)
    hits = plan.entry.hits
    for _ in range(4):
        mx.eval(mx.fast.rms_norm(x, w, 1e-4))
    assert len(rule.plans) == n and plan.entry.hits == hits + 4


@needs_cc
def test_recording_changes_only_the_records():
    x = mx.array(np.random.default_rng(1).standard_normal((2, 4, 3, 16)).astype(np.float32))
    mx.eval(x)

    def run():
        return np.array(mx.fast.rope(mx.sum(x, axis=0, keepdims=True), 16, traditional=True,
                                     base=500.0, scale=0.5, offset=3))

    first = run()
    counts = evaluate.dispatch_counts()
    run()
    plain = {k: v - counts[k] for k, v in evaluate.dispatch_counts().items()}
    counts = evaluate.dispatch_counts()
    with launched() as rec:
        recorded = run()
    seen = {k: v - counts[k] for k, v in evaluate.dispatch_counts().items()}
    assert recorded.tobytes() == first.tobytes() == run().tobytes()
    assert seen == plain
    assert {"RoPE", "Sum"} <= rec.primitives and not rec.fallbacks


@needs_cc
def test_the_c_and_python_kernel_calls_write_the_same_bytes():
    if kc.KernelCall is kc.PyKernelCall:
        pytest.skip("the C extension is not built")
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    w = np.random.default_rng(3).standard_normal(64).astype(np.float32)
    plan = RULES["RMSNorm"].plan(x, w, eps=1e-5)
    c_out, py_out = np.empty_like(x), np.empty_like(x)
    plan(x, w, c_out)
    fn = kc.ctypes.cast(plan.entry.fast_fn(gil=True), kc.ctypes.c_void_p).value
    call = norms.norm_call("RMSNorm", x.dtype, x.shape, norms.elem_strides(x), (1,))
    params = call.spec.kernel_params()
    fp = np.array([1e-5], np.float32)
    vec = arguments(params, {"x": 0, "w": 0, "out": 0, "fp": fp.ctypes.data}, call.ints, {})
    where = {p.name: i for i, p in enumerate(params)}
    py = kc.PyKernelCall(fn, True, tuple(vec), (where["x"], where["w"], where["out"]), fp,
                         None, lambda *a: None, x.shape, x.dtype)
    py(x, w, py_out)
    assert c_out.tobytes() == py_out.tobytes()
    np.testing.assert_allclose(c_out, _rms_ref(x, w, 1e-5), rtol=2e-5, atol=2e-6)


@needs_cc
def test_a_cleared_kernel_cache_drops_the_plans():
    x = mx.array(np.ones((2, 8), np.float32))
    mx.eval(mx.max(x, axis=-1))
    assert RULES["Max"].plans
    compiler.clear()
    assert not RULES["Max"].plans
    assert np.array(mx.max(x * 2, axis=-1)).tolist() == [2.0, 2.0]


@needs_cc
def test_bad_calls_raise_clear_errors():
    x = np.ones((2, 8), np.float32)
    plan = RULES["Max"].plan(x, axes=(1,))
    with pytest.raises(TypeError, match="takes 2 arrays"):
        plan(x)
    with pytest.raises(TypeError, match="numpy arrays"):
        plan(x, [0.0, 0.0])
    if kc.KernelCall is not kc.PyKernelCall:
        with pytest.raises(ValueError, match="slot 3 outside"):
            kc.KernelCall(1, True, (0,), (3,), None, None, None, (), np.dtype(np.float32))




@needs_cc
@requires_mlx
@settings(max_examples=12, deadline=None)
@given(shape=st.sampled_from([(7,), (3, 5), (2, 3, 4), (64,)]),
       dtype=st.sampled_from([np.float32, np.float16]),
       transposed=st.booleans(), donate=st.booleans(), seed=st.integers(0, 2**16))
def test_a_multi_output_fused_call_runs_from_its_plan(shape, dtype, transposed, donate, seed):
    """A fused call with several outputs (Adam's update: the parameter and both moments)
    runs, once planned, from its Launch's KernelCall in the loop's C part (counted as
    ``fused_kernel``, not ``run_compiled``): the same bytes as its first call (the Python
    path), values as MLX's, with its inputs donated (nothing else holds them) or held."""
    import mlx.core as mlx

    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(shape).astype(dtype) for _ in range(4)]
    arrays[2] = np.abs(arrays[2])  # the second moment
    if transposed and len(shape) > 1:
        arrays[0] = np.ascontiguousarray(arrays[0].T).T

    def step(lib, p, m, v, g):
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * lib.square(g)
        return p - 0.01 * m / (lib.sqrt(v) + 1e-3), m, v

    results, counts = {}, []
    for lib in (mx, mlx):
        fn = lib.compile(lambda *a, lib=lib: step(lib, *a))
        outs = []
        for _ in range(3):  # the first call plans; the later ones run the plan
            ins = [lib.array(a) + 0.0 for a in arrays]  # computed: allocator buffers
            lib.eval(*ins)
            held = [] if donate else list(ins)
            before = evaluate.dispatch_counts() if lib is mx else None
            got = fn(*ins)
            del ins
            lib.eval(*got)
            if before is not None:
                after = evaluate.dispatch_counts()
                counts.append({k: after[k] - before[k] for k in ("fused_kernel", "run_compiled")})
            outs.append([np.array(g) for g in got])
            del held
        results[lib] = outs
    ours, theirs = results[mx], results[mlx][-1]
    for o in ours[1:]:
        assert all(x.tobytes() == y.tobytes() for x, y in zip(ours[0], o))
    tol = 2e-3 if dtype == np.float16 else 1e-5
    for x, y in zip(ours[-1], theirs):
        np.testing.assert_allclose(x.astype(np.float64), y.astype(np.float64), rtol=tol, atol=tol)
    assert counts[-1] == {"fused_kernel": 1, "run_compiled": 0}, counts


class _Plan:
    def __init__(self, gen):
        self.gen = gen


class _Tape:
    def __init__(self):
        self.launches = {}


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=0, max_size=3), tag=st.sampled_from([None, "cuda"]),
       refuse=st.booleans(), stale=st.booleans(), planned=st.booleans(), consts=st.booleans())
def test_the_c_and_python_plan_lookups_agree(shape, tag, refuse, stale, planned, consts):
    """A fused call's plan found by its layouts (PlanLookup, a backend's launch_for): the C
    type and the Python class give the same plan (the object filed under the key run_compiled
    files it under) or None, against the key built here."""
    if kc._C_PLAN_LOOKUP is None:
        pytest.skip("the extension is not built")
    a = np.zeros(shape, np.float32)
    b = np.zeros(shape[::-1], np.int8).T  # another layout
    inputs = [a, np.float32(2.0), b] if consts else [a, b]
    arrays = (0, 2) if consts else (0, 1)
    gen = [7]
    tape = _Tape()
    plan = _Plan(6 if stale else 7)
    if planned:
        tape.launches[tag] = arrays
        pairs = [(inputs[i].shape, inputs[i].strides) for i in arrays]
        tape.launches[(tuple(shape), *pairs) if tag is None else (tag, tuple(shape), *pairs)] = plan
    refused = np.ndarray if refuse else None
    want = None if not planned or stale or refuse else plan
    for lookup in (kc._C_PLAN_LOOKUP(tag, gen, refused), kc.PyPlanLookup(tag, gen, refused)):
        assert lookup(tape, inputs, tuple(shape)) is want
        assert lookup(tape, tuple(inputs), tuple(shape)) is want
        assert lookup(tape, inputs, tuple(shape) + (1,)) is None  # another output shape
    gen[0] = 6  # the kernel cache's generation moved: the other plans are stale now
    for lookup in (kc._C_PLAN_LOOKUP(tag, gen, refused), kc.PyPlanLookup(tag, gen, refused)):
        assert lookup(tape, inputs, tuple(shape)) is (plan if planned and stale and not refuse else None)


def test_plan_lookup_bad_calls_raise_clear_errors():
    if kc._C_PLAN_LOOKUP is None:
        pytest.skip("the extension is not built")
    for cls in (kc._C_PLAN_LOOKUP, kc.PyPlanLookup):
        with pytest.raises(TypeError):
            cls(None, (0,))  # the generation is a list
        with pytest.raises(TypeError):
            cls([], [0])  # an unhashable tag
    with pytest.raises(TypeError, match="tape, inputs, shape"):
        kc._C_PLAN_LOOKUP(None, [0])(_Tape(), [])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["call", "call", "call", "file", "drop", "gen"]),
                          st.integers(0, 1), st.integers(0, 3), st.integers(0, 3)), max_size=40))
def test_the_c_lookup_s_remembered_hits_follow_every_change_as_the_python_lookup(seq):
    """Sequences of lookups on the same two tapes (the C lookup remembers a tape's last hit
    by its dict's version, the generation and the inputs' layouts): after new plans are
    filed, plans dropped, the generation moved, and calls with other layouts (the same
    shape transposed, sliced, another shape, a non-array input), the C and Python lookups
    give the same plan every time."""
    if kc._C_PLAN_LOOKUP is None:
        pytest.skip("the extension is not built")
    base = np.zeros((4, 6), np.float32)
    layouts = [base, base[:, ::2].copy(), base[:, ::2], np.zeros((6, 4), np.float32).T]
    tapes = [_Tape(), _Tape()]
    for t in tapes:
        t.launches[None] = (0, 1)
    gen = [1]
    c, py = kc._C_PLAN_LOOKUP(None, gen), kc.PyPlanLookup(None, gen)
    shape = (4, 6)
    for op, t, i, j in seq:
        tape, x, y = tapes[t], layouts[i], layouts[j]
        key = (shape, (x.shape, x.strides), (y.shape, y.strides))
        if op == "file":
            tape.launches[key] = _Plan(gen[0])
        elif op == "drop":
            tape.launches.pop(key, None)
        elif op == "gen":
            gen[0] += 1
        for inputs in ([x, y], (x, y), [x, np.float32(0.0)]):
            got = c(tape, inputs, shape)
            assert got is py(tape, inputs, shape)
            assert c(tape, inputs, shape) is got  # the remembered hit, once more
