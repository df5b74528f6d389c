"""A fused CUDA kernel with several outputs writes into donated input buffers only where the
output's value reads that input (``kernels/cuda/compiled.py`` ``_outputs``): the kernels'
pointers are ``__restrict__``, so a store that does not depend on a load may be moved before
it. MLX's test_compile ``test_compile_many_outputs`` (a tree of 64 additions returning its
root and the 32 first sums, split into several kernels) gave [26, 68] for [64, 128] on the
H200. numpy is the reference.

The program runs on a GPU (``TAPESCOPE_CUDA=1``); the donation rule's check also runs over
the stand-in CuPy (``tests/test_cuda_backend_fake.py``), where no kernel is built.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

import tapescope.core as mx
from conftest import needs_cuda

# the CUDA runtime needed (skips without it); the GPU the default device for each test
pytestmark = [needs_cuda, pytest.mark.usefixtures("gpu_default_device")]


def tree(n: int):
    def fun(arr):
        arrs, first = [arr] * n, None
        while len(arrs) > 1:
            arrs = [x + y for x, y in zip(arrs[::2], arrs[1::2])]
            if first is None:
                first = arrs
        return arrs[0], first
    return fun


@pytest.mark.parametrize("n", [8, 32, 64, 128])
@pytest.mark.parametrize("size", [2, 1000, 4099])
def test_a_compiled_tree_with_many_outputs_is_numpys(n, size):
    h = np.random.default_rng(n + size).standard_normal(size).astype(np.float32)
    out, first = mx.compile(tree(n))(mx.array(h) * 1)  # a temporary input: donatable
    want_first = h.astype(np.float64) * 2
    np.testing.assert_allclose(np.array(out), h.astype(np.float64) * n, rtol=1e-5, atol=1e-5)
    for f in first:
        np.testing.assert_allclose(np.array(f), want_first, rtol=1e-6, atol=1e-6)


def test_an_input_gives_its_buffer_only_to_an_output_that_reads_it():
    import cupy

    from tapescope.kernels.codegen.tape import Tape, TapeInput, TapeOp
    from tapescope.kernels.cuda import compiled

    f4 = np.dtype(np.float32)
    # outputs: C = A + A (reads A only), D = B + C (reads A and B)
    tape = Tape((TapeInput("A", f4), TapeInput("B", f4)),
                (TapeOp("C", "Add", f4, ("A", "A")), TapeOp("D", "Add", f4, ("B", "C"))),
                ("C", "D"), lib_name="t_donation")
    assert compiled._reads(tape) == (frozenset("A"), frozenset("AB"))
    ln = types.SimpleNamespace(dtypes=[f4, f4], shape=(4,), contiguous=True, order="C",
                               takes=lambda out: False)
    a, b = cupy.asarray(np.ones(4, f4)), cupy.asarray(np.ones(4, f4))

    def donors(outs):
        return [[i for i, x in enumerate((a, b)) if cupy.shares_memory(o, x)] for o in outs]

    # A to C (which reads A), B to D (which reads B)
    assert donors(compiled._outputs(tape, ln, [a, b], None, [True, True])) == [[0], [1]]
    # B cannot go to C, which does not read it: both outputs fresh
    assert donors(compiled._outputs(tape, ln, [a, b], None, [False, True])) == [[], []]
