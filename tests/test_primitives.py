"""The primitive registry: every definition has every facet, or says why it has none.

Facets: the array-module rule, the output shape and dtype rules (a function, or where the op
computes them), the C spelling (for what fusion may put in a kernel), the JAX reference rule
(in ``tapescope.check``, written independently), and the vjp / jvp / vmap rules.
``python tests/test_primitives.py`` prints the table of stated reasons with their counts.
"""

from __future__ import annotations

import collections
import pathlib
import re

import ml_dtypes
import numpy as np
import pytest

import tapescope.core as mx
from tapescope.check import jax_rules
from tapescope.kernels import primitives
from tapescope.kernels.codegen.c_ops import Unsupported
from tapescope.kernels.codegen.render import cannot_render, renderer

FACETS = ("rule", "shape", "dtype", "c", "jax", "vjp", "jvp", "vmap")
ROOT = pathlib.Path(__file__).resolve().parents[1]


def facet_table() -> dict:
    """name -> facet -> ("present", detail) or ("absent", reason) or ("missing", None)."""
    jax = jax_rules.table()
    table = {}
    for name, d in sorted(primitives.REGISTRY.items()):
        row = {}
        facets = d.facets()
        facets["jax"] = jax.get(name)
        why = dict(d.why)
        if name in jax_rules.WITHOUT_RULE:
            why["jax"] = jax_rules.WITHOUT_RULE[name]
        for f in FACETS:
            if facets[f] is not None:
                row[f] = ("present", facets[f])
            elif why.get(f):
                row[f] = ("absent", why[f])
            else:
                row[f] = ("missing", None)
        table[name] = row
    return table


def reason_counts() -> collections.Counter:
    """(facet, stated reason) -> how many primitives give it."""
    c = collections.Counter()
    for row in facet_table().values():
        for f, (state, detail) in row.items():
            if state == "absent":
                c[(f, detail)] += 1
    return c


def test_every_primitive_has_every_facet_or_a_stated_reason():
    missing = [(name, f) for name, row in facet_table().items()
               for f, (state, _) in row.items() if state == "missing"]
    assert not missing, f"facets neither present nor explained: {missing}"


def test_the_registry_lists_every_primitive_the_op_layer_records():
    """The 121 MLX primitives of the op layer and the two of compile (Compiled, Placeholder);
    a name no definition has cannot be recorded at all."""
    from tapescope.core.primitive import Primitive

    assert len(primitives.REGISTRY) >= 121
    for name in ("Add", "Exp", "ErfInv", "Sum", "Broadcast", "AsType", "Compiled",
                 "Placeholder", "Gather", "FFT", "RandomBits", "DivMod", "Select"):
        assert name in primitives.REGISTRY
    with pytest.raises(KeyError, match="unregistered primitive NoSuchOp"):
        Primitive("NoSuchOp", mx.default_stream(mx.cpu))


def test_every_absent_c_spelling_of_a_fusable_primitive_is_a_fusion_boundary():
    """A fusable primitive without a C spelling says so, and fusion's question gets that
    answer (so the op becomes a boundary rather than a tape the runtime cannot build)."""
    f4 = np.dtype(np.float32)
    for name, d in primitives.REGISTRY.items():
        if d.fusable and "c" not in d.spellings:
            assert "fusion boundary" in d.why["c"], name
            assert cannot_render(name, [f4], f4) == f"no C spelling for {name}"
    assert not primitives.REGISTRY["ErfInv"].spellings  # the known one, until it is spelled


def test_every_c_spelling_renders_for_a_dtype_it_is_meant_for():
    """Each spelling gives an expression for some dtype MLX applies the op to, and refuses
    (Unsupported) rather than emitting wrong C for the rest."""
    d = renderer("c")
    dtypes = [np.dtype(t) for t in ("float32", "float64", "float16", "int32", "uint8", "bool")]
    dtypes.append(np.dtype(ml_dtypes.bfloat16))
    for name, dfn in primitives.REGISTRY.items():
        if "c" not in dfn.spellings:
            continue
        n_in = {"unary": 1, "binary": 2, "ternary": 3, "astype": 1, "broadcast": 1}[dfn.family]
        ok = []
        for dt in dtypes:
            try:
                expr = d.op_expr(name, [f"a{k}" for k in range(n_in)], dt, dt)
            except Unsupported:
                continue
            assert isinstance(expr, str) and expr, name
            ok.append(dt)
        assert ok, f"{name}: its C spelling renders for no dtype"


def test_fusion_families_and_flags_agree_with_the_rules():
    for name, d in primitives.REGISTRY.items():
        assert callable(d.rule), name
        assert d.fusable == (d.family in primitives.FUSABLE), name
        if d.view:  # views are made by a rule, never written into ``out=``
            assert not d.takes_out, name
    assert primitives.REGISTRY["Compiled"].takes_donatable
    assert {n for n, d in primitives.REGISTRY.items() if d.view} == {
        "Broadcast", "Reshape", "ExpandDims", "Squeeze", "Flatten", "Unflatten", "Transpose",
        "Slice", "AsStrided", "Depends", "Copy"}  # Copy: MLX's Copy::eval shares the buffer


def test_generic_shape_rules_match_what_the_ops_record():
    """Where a family's shape rule is generic, it gives the shape the op layer recorded."""
    a = mx.ones((2, 1, 3))
    b = mx.ones((4, 1))
    for out, ins, params in [
        (mx.add(a, b), [(2, 4, 3), (2, 4, 3)], {}),
        (mx.exp(a), [(2, 1, 3)], {}),
        (mx.sum(a, axis=(0, 2), keepdims=True), [(2, 1, 3)], {"axes": (0, 2)}),
        (mx.broadcast_to(b, (3, 4, 5)), [(4, 1)], {"shape": (3, 4, 5)}),
    ]:
        d = out._d.node.primitive.defn
        assert d.shape(ins, **params) == [tuple(out.shape)], d.name


def test_jax_rules_stay_independent_of_our_rules():
    """The reference table must not borrow tapescope's rules (a shared mistake would pass)."""
    src = (ROOT / "interactive" / "check" / "jax_rules.py").read_text()
    imports = [ln for ln in src.splitlines() if ln.strip().startswith(("import ", "from "))]
    assert not [ln for ln in imports if "tapescope" in ln or ln.strip().startswith("from .")]


# Primitives MLX cannot vmap (``[Primitive::vmap] Not implemented for <Name>.``), each with a
# program that makes MLX raise it; Arange, Placeholder and Recv have no inputs to map.
# ReduceScatter raises only in a group of more than one process: tests/test_distributed_mpi.py.
NO_VMAP_IN_MLX = {
    "AsStrided": "M.vmap(lambda a: M.as_strided(a, (2,), (1,)))(M.ones((3, 4)))",
    "QRF": "M.vmap(lambda a: M.linalg.qr(a, stream=M.cpu)[0])(M.ones((2, 3, 3)))",
    "LUF": "M.vmap(lambda a: M.linalg.lu_factor(a, stream=M.cpu)[0])(M.ones((2, 3, 3)))",
    "GatherMM": "M.vmap(lambda a: M.gather_mm(a, M.ones((2, 4, 5)), M.array([0]), "
                "M.array([1])))(M.ones((2, 3, 2, 4)))",
    "BlockMaskedMM": "M.vmap(lambda a: M.block_masked_mm(a, M.ones((4, 5)), 32, "
                     "M.ones((1, 1))))(M.ones((2, 3, 4)))",
    "SegmentedMM": "M.vmap(lambda a: M.segmented_mm(a, M.ones((4, 5)), M.array([[0, 2]])))("
                   "M.ones((2, 3, 4)))",
    "ToFP8": "M.vmap(M.to_fp8)(M.ones((2, 3)))",
    "FromFP8": "M.vmap(lambda a: M.from_fp8(a))(M.ones((2, 3), M.uint8))",
    "QQMatmul": "M.vmap(lambda a: M.qqmm(a, M.ones((32, 32))))(M.ones((2, 1, 32)))",
    "GatherQQMM": "M.vmap(lambda a: M.gather_qqmm(a, M.ones((2, 32, 32)), "
                  "rhs_indices=M.array([1])))(M.ones((2, 1, 32)))",
    "Depends": "M.vmap(lambda a: M.depends(a * 2, a * 3))(M.ones((2, 3)))",
}
# Primitives whose MLX vmap rule raises its own NYI error (ours: the generic one), with it.
NYI_VMAP_IN_MLX = {
    "QuantizedMatmul": ("[QuantizedMatmul::vmap] NYI", "M.vmap(lambda a: M.quantized_matmul("
                        "a, *M.quantize(M.ones((32, 64)))))(M.ones((2, 1, 64)))"),
    "GatherQMM": ("GatherQMM::vmap NYI", "M.vmap(lambda a: M.gather_qmm(a, *M.quantize("
                  "M.ones((2, 32, 64))), rhs_indices=M.array([1])))(M.ones((2, 1, 64)))"),
}


def test_every_primitive_has_a_batching_rule_or_an_mlx_matching_reason():
    """A batching rule, or a reason that is not the 'not written yet' placeholder: MLX has
    no rule either (and raises the same error, below), or nothing can be mapped through it."""
    absent = {}
    for name, d in primitives.REGISTRY.items():
        if d.vmap is None:
            why = d.why.get("vmap")
            assert why and why != primitives.VMAP_LATER, name
            absent[name] = why
    # CustomKernel: MLX's has no vmap either, and without Metal MLX cannot make one to map
    assert set(absent) == set(NO_VMAP_IN_MLX) | set(NYI_VMAP_IN_MLX) | {
        "Arange", "Load", "Placeholder", "Recv", "ReduceScatter", "CustomKernel"}
    for name, (nyi, _) in NYI_VMAP_IN_MLX.items():
        assert nyi in absent[name]
    assert "Not implemented for Sum ReduceScatter." in absent["ReduceScatter"]
    for name in NO_VMAP_IN_MLX:
        assert f"Not implemented for {name}." in absent[name]


@pytest.mark.parametrize("name", sorted(NO_VMAP_IN_MLX))
def test_a_primitive_without_a_batching_rule_raises_mlx_error(name):
    from mlx_compare import same_error

    same_error(lambda M: eval(NO_VMAP_IN_MLX[name], {"M": M}))


@pytest.mark.parametrize("name", sorted(NYI_VMAP_IN_MLX))
def test_a_primitive_mlx_cannot_batch_yet_raises(name):
    from conftest import mlx_ref

    if mlx_ref is None:
        pytest.skip("mlx is not installed")
    nyi, program = NYI_VMAP_IN_MLX[name]
    with pytest.raises(RuntimeError, match=re.escape(nyi)):
        mlx_ref.eval(eval(program, {"M": mlx_ref}))
    with pytest.raises(ValueError, match=f"Not implemented for {name}"):
        mx.eval(eval(program, {"M": mx}))


if __name__ == "__main__":  # the table of stated reasons
    for (facet, why), n in sorted(reason_counts().items(), key=lambda kv: (kv[0][0], -kv[1])):
        print(f"{n:4d}  {facet:6s} {why}")
