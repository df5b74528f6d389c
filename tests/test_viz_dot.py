"""Graph -> DOT: golden pictures of small graphs, determinism, and the drawing options.

Golden files live in tests/golden/viz_*.dot; after a deliberate change to the picture,
regenerate them with ``TAPESCOPE_UPDATE_GOLDEN=1 pytest tests/test_viz_dot.py`` and look at
them (``dot -Tpng``) before committing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tapescope
import tapescope.core as mx

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("TAPESCOPE_UPDATE_GOLDEN") == "1"
from conftest import needs_dot


def f32(*shape, start=1.0):
    n = int(np.prod(shape)) if shape else 1
    return mx.array(np.arange(start, start + n, dtype=np.float32).reshape(shape))


def g_eager():
    a = f32(2)
    return tapescope.graph_of(mx.exp(a) * 2 + 1)


def g_compiled():
    return tapescope.trace(lambda x: mx.exp(x) * 2 + 1, f32(2, 3))


def g_multi_output():
    def softmaxish(x, y):
        s = mx.sum(x * y, axis=1, keepdims=True)
        return mx.exp(x - s), s

    return tapescope.trace(softmaxish, f32(4, 8), f32(8))


def g_divmod():
    q, r = mx.divmod(f32(3), f32(3, start=2.0))
    return tapescope.graph_of(q, r)


def g_broadcast():
    return tapescope.trace(lambda x, y: x + y, f32(3, 1), f32(4), compile=False)


def g_constants():
    w = f32(2, 2)  # a closed-over array and a Python scalar

    def affine(x):
        return x * w + 0.5

    return tapescope.trace(affine, f32(2, 2), compile=False)


def g_constants_compiled():
    w = f32(2, 2)

    def affine(x):
        return x * w + 0.5

    return tapescope.trace(affine, f32(2, 2))


GRAPHS = {
    "eager": g_eager, "compiled": g_compiled, "multi_output": g_multi_output, "divmod": g_divmod,
    "broadcast": g_broadcast, "constants": g_constants, "constants_compiled": g_constants_compiled,
}


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_golden_dot(name):
    text = GRAPHS[name]().to_dot()
    path = GOLDEN / f"viz_{name}.dot"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


@needs_dot
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_golden_dot_is_valid_graphviz(name):
    proc = subprocess.run(["dot", "-Tsvg"], input=(GOLDEN / f"viz_{name}.dot").read_bytes(),
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert b"Warning" not in proc.stderr and b"Error" not in proc.stderr


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_same_graph_gives_byte_identical_dot(name):
    first = GRAPHS[name]().to_dot()
    _ = [mx.exp(f32(3)) for _ in range(7)]  # advance every global counter in between
    assert GRAPHS[name]().to_dot() == first


def _node_ids(text: str) -> list:
    return re.findall(r"^\s+(\w+) \[", text, flags=re.M)


def test_node_ids_are_graph_local():
    ids = set(_node_ids(g_compiled().to_dot())) - {"graph", "node", "edge"}
    assert {"v0", "k0_A", "k0_C", "k0_E", "out0", "legend"} <= ids
    assert all(re.fullmatch(r"(v\d+(_\w+)?|op\d+|k\d+_[A-Z]+|out\d+|legend|hidden|s\d+_\w+)", i)
               for i in ids)


def test_options_rankdir_shapes_legend_title():
    g = g_multi_output()
    lr = g.to_dot(rankdir="LR")
    assert 'rankdir=LR' in lr and 'rankdir=TB' in g.to_dot()
    assert "(4, 8) float32" in g.to_dot()
    plain = g.to_dot(shapes=False, dtypes=False)
    assert "(4, 8)" not in plain and "float32" not in plain
    assert "float32" in g.to_dot(shapes=False) and "(4, 8)" not in g.to_dot(shapes=False)
    assert "legend" not in g.to_dot(legend=False)
    assert "softmaxish" not in g.to_dot(title=False) and "softmaxish" in g.to_dot()
    with pytest.raises(ValueError, match="rankdir"):
        g.to_dot(rankdir="UP")
    with pytest.raises(ValueError, match="max_nodes"):
        g.to_dot(max_nodes=0)


def test_kernel_cluster_label_names_kernel_and_variant():
    g = g_multi_output()
    text = g.to_dot()
    assert text.count("subgraph cluster_k") == 2
    for k in g.kernels:
        assert k.variant == "strided_2"
        assert k.name[:40] in text.replace('<BR ALIGN="LEFT"/>', "")
    short = g.to_dot(kernel_names=False)
    assert 'FACE="Courier"' not in short and g.kernels[0].name[:40] not in short.replace(
        g.kernels[0].symbol, "")  # the full name stays only in the tooltip
    collapsed = g.to_dot(expand_kernels=False)
    assert "subgraph" not in collapsed and collapsed.count("<B>kernel ") == 2


def test_boundary_reasons_on_edges_into_kernels():
    text = g_multi_output().to_dot()
    red = re.findall(r'-> k\d+_[A-Z]+ \[label=<<FONT COLOR="#b91c1c"><I>([^<]+)</I>', text)
    assert sorted(red) == ["argument", "argument", "argument", "reduction"]

    def chain(x):
        for _ in range(15):
            x = mx.sin(x)
        return x

    text = tapescope.trace(chain, f32(3)).to_dot()
    assert re.search(r'k0_\w+ -> k1_A \[label=<<FONT COLOR="#b91c1c"><I>depth limit</I>', text)


def test_evaluated_solid_lazy_dashed():
    a = f32(2)
    lazy_in = mx.exp(f32(2))
    text = tapescope.graph_of(a + lazy_in).to_dot()
    styles = dict(re.findall(r'^\s+(v\d+) \[.*?style="([^"]+)"', text, flags=re.M))
    assert sorted(styles.values()) == ["rounded,filled", "rounded,filled"]  # both inputs hold data
    out_style = re.search(r'^\s+out0 \[.*?style="([^"]+)"', text, flags=re.M).group(1)
    assert "dashed" in out_style
    traced = tapescope.trace(lambda x: x + 1, lazy_in, compile=False).to_dot()
    assert re.search(r'^\s+v0 \[.*style="rounded,filled,dashed"', traced, flags=re.M)


def test_scalar_constants_show_their_value():
    text = g_constants().to_dot()
    assert "<B>c1</B> = 0.5" in text
    assert "<B>c0</B><BR/>" in text  # the closed-over (2, 2) array: name, no value
    assert "C = 0.5" in g_constants_compiled().to_dot()  # inlined into the kernel


def _big(n):
    def big(x):
        for _ in range(n):
            x = mx.sum(mx.exp(x) * 2, axis=0, keepdims=True) + x
        return x
    return tapescope.trace(big, f32(3, 3))


def test_large_graph_groups_kernels_then_truncates_with_a_note():
    g = _big(60)  # each round: its exp * 2 kernel, the Sum, the add kernel (its Broadcast fused in)
    assert len(g.ops) == 180
    full = g.to_dot(max_nodes=None)
    assert full.count("subgraph cluster_k") == len(g.kernels)
    grouped = g.to_dot(max_nodes=200)
    assert "subgraph" not in grouped and "each fused kernel is one box" in grouped
    assert len(re.findall(r"^\s+op\d+ \[", grouped, flags=re.M)) == 180
    cut = g.to_dot(max_nodes=50)
    drawn = re.findall(r"^\s+op(\d+) \[", cut, flags=re.M)
    assert len(drawn) == 50 and sorted(map(int, drawn)) == list(range(130, 180))
    assert "130 earlier ops not drawn" in cut and "the graph has 180 ops" in cut


def test_drawing_a_graph_whose_kernels_ran_reads_the_timeline_at_most_once(monkeypatch):
    # a kernel's tier (the picture's "interpreted" mark) and sources need the kernel cache's
    # names, runtimes and sources, not kernel_cache()'s roofline columns, which read the whole
    # timeline (up to 100,000 records): once per kernel drawn made a big picture after a
    # long recorded session take minutes
    from tapescope.kernels import timeline

    def big(x):
        for _ in range(20):
            x = mx.sum(mx.exp(x) * 2, axis=0, keepdims=True) + x
        return x

    x = f32(3, 3)
    timeline.set_recording(True)
    try:
        mx.eval(mx.compile(big)(x))  # the kernels are built, run and on the timeline
    finally:
        timeline.set_recording(False)
    g = tapescope.trace(big, x)
    ran = "cuda" if mx.default_device() == mx.gpu else "kernel"  # (make test-gpu's GPU part)
    assert len(g.kernels) >= 40 and all(k.tier == ran for k in g.kernels)
    reads = []
    real = timeline.records
    monkeypatch.setattr(timeline, "records", lambda: reads.append(1) or real())
    for options in ({}, {"max_nodes": 50}, {"max_nodes": None}):
        g.to_dot(**options)
    assert all(k.sources["cpu"] for k in g.kernels[:3])
    assert len(reads) <= 1
    before = len(reads)
    entries = g.kernels[0].cached()  # the kernel's own kernel_cache() rows, roofline included
    assert entries and len(reads) == before + 1 and entries[0]["roofline"]["launches"] >= 1
    assert entries == [e for e in tapescope.kernel_cache() if e["name"].startswith(g.kernels[0].name + "_")]


@needs_dot
def test_large_graph_renders_quickly():
    g = _big(200)
    assert len(g.ops) > 500
    svg = g.to_svg()
    assert "earlier ops not drawn" in svg or "each fused kernel is one box" in svg
    assert g.to_svg(max_nodes=None).count('class="node"') > 600


def test_a_compiled_functions_program_is_drawn_without_lazy_dashes():
    # the %%mlx report draws each compiled function's program: placeholders, neither lazy nor
    # computed, so nothing is dashed and the legend has no lazy / evaluated row
    from tapescope import magic

    f = mx.compile(lambda a: mx.exp(a) * 2 + a)
    mx.eval(f(f32(3)))
    ((title, g),) = magic._program_graphs("f", f)
    assert g.program and g.kernels
    text = g.to_dot()
    assert "dashed" not in text.replace("lazy", "") and "lazy (not computed yet)" not in text
    lazy = tapescope.trace(lambda a: mx.exp(a) * 2 + a, mx.exp(f32(3))).to_dot()
    assert "dashed" in lazy and "lazy (not computed yet)" in lazy  # a trace of a lazy argument
