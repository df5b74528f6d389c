"""DOT -> SVG/PNG through dot, the notebook display, and the path without graphviz."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import tapescope
import tapescope.core as mx
from tapescope.viz import render

from conftest import needs_dot

SVG = "{http://www.w3.org/2000/svg}"


def gelu(x):
    return x * (1 + mx.erf(x / mx.sqrt(mx.array(2.0)))) / 2


def x48():
    return mx.array(np.linspace(-2, 2, 32, dtype=np.float32).reshape(4, 8))


def clusters(svg: str) -> list:
    """(title, texts) of every cluster group of an SVG drawn by dot."""
    root = ET.fromstring(svg)
    out = []
    for g in root.iter(f"{SVG}g"):
        if g.get("class") == "cluster":
            title = g.find(f"{SVG}title").text
            out.append((title, [t.text for t in g.iter(f"{SVG}text")]))
    return out


def node_texts(svg: str) -> list:
    root = ET.fromstring(svg)
    return [[t.text for t in g.iter(f"{SVG}text")] for g in root.iter(f"{SVG}g") if g.get("class") == "node"]


@needs_dot
def test_compiled_gelu_svg_has_exactly_one_cluster_with_the_tape():
    g = tapescope.trace(gelu, x48())
    svg = g.to_svg()
    (cl,) = clusters(svg)
    assert cl[0] == "cluster_k0"
    assert cl[1][:2] == ["kernel 0", " · contiguous · 9 ops · (4, 8)"]
    (k,) = g.kernels
    shown = "".join(cl[1][2:])  # the kernel name cut to fit the box (head … tail)
    assert len(shown) <= 36 and shown.startswith(k.name[:20]) and shown.endswith(k.name[-10:])
    assert f"{k.name}_{k.variant}" in svg  # the full name: the cluster's tooltip
    # the tape's ops are nodes inside the cluster: x*(1+erf(x/sqrt(2)))/2 as MLX records it
    prims = [t[0] for t in node_texts(svg) if len(t) == 3 and t[2].isalpha() and t[2].isupper()]
    assert sorted(prims) == sorted(["Sqrt", "Broadcast", "Divide", "Erf", "Broadcast", "Add",
                                    "Multiply", "Broadcast", "Divide"])
    assert "argument" in svg  # the edge from x into the kernel says why fusion stopped there


@needs_dot
def test_uncompiled_gelu_svg_has_no_cluster():
    svg = tapescope.trace(gelu, x48(), compile=False).to_svg()
    assert clusters(svg) == []
    assert sum(1 for t in node_texts(svg) if t and t[0] in ("Erf", "Divide", "Multiply")) == 4


@needs_dot
def test_reduction_and_depth_limit_labels_in_svg():
    def f(x):
        return mx.exp(x - mx.sum(x * 2, axis=-1, keepdims=True))

    assert "reduction" in tapescope.trace(f, x48()).to_svg()

    def chain(x):
        for _ in range(15):
            x = mx.sin(x)
        return x

    svg = tapescope.trace(chain, x48()).to_svg()
    assert len(clusters(svg)) == 2 and "depth limit" in svg


@needs_dot
def test_mimebundle_svg_and_text():
    g = tapescope.trace(gelu, x48())
    bundle = g._repr_mimebundle_()
    assert set(bundle) == {"image/svg+xml", "text/plain"}
    assert bundle["image/svg+xml"].startswith("<svg")  # inline-able in nbconvert HTML
    ET.fromstring(bundle["image/svg+xml"])
    assert bundle["text/plain"] == repr(g)
    drawn = g.draw(rankdir="LR", legend=False)._repr_mimebundle_()
    assert drawn["image/svg+xml"] != bundle["image/svg+xml"]


@needs_dot
def test_png_and_save(tmp_path):
    g = tapescope.trace(gelu, x48())
    png = g.to_png()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    for ext in ("svg", "png", "dot", "pdf"):
        p = tmp_path / f"g.{ext}"
        g.save(str(p))
        assert p.stat().st_size > 100
    assert (tmp_path / "g.dot").read_text() == g.to_dot()
    with pytest.raises(ValueError, match="Unknown picture format"):
        g.save(str(tmp_path / "g.jpeg"))


@needs_dot
def test_render_errors():
    with pytest.raises(ValueError, match="format"):
        render.render("digraph {}", "gif")
    with pytest.raises(render.RenderError, match="dot exited"):
        render.render("digraph { a -> }", "svg")


def test_missing_dot_message_and_bundle(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without dot
    monkeypatch.delenv("TAPESCOPE_DOT", raising=False)
    assert render.find_dot() is None
    g = tapescope.trace(gelu, x48())
    bundle = g._repr_mimebundle_()
    assert set(bundle) == {"text/plain"}
    text = bundle["text/plain"]
    assert "graphviz 'dot' program was not found" in text
    assert "install" in text.lower() and "graphviz" in text.split("Install it with:")[1].split("\n")[1]
    assert g.to_dot() in text  # the DOT text, ready for any other viewer
    with pytest.raises(render.GraphvizNotFound) as info:
        g.to_svg()
    lines = info.value._render_traceback_()  # what IPython prints: the message, no traceback
    assert "Traceback" not in "\n".join(lines) and "not found" in lines[0]


def test_missing_dot_in_a_fresh_process_prints_no_traceback(tmp_path):
    code = ("import numpy as np, tapescope, tapescope.core as mx\n"
            "g = tapescope.trace(lambda x: mx.exp(x) + 1, mx.array(np.ones(3, np.float32)))\n"
            "print(g._repr_mimebundle_()['text/plain'])\n")
    env = dict(os.environ, PATH=str(tmp_path))
    env.pop("TAPESCOPE_DOT", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "digraph tapescope {" in proc.stdout and "Install it with:" in proc.stdout


def test_dot_override_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TAPESCOPE_DOT", str(tmp_path / "nope"))
    assert render.find_dot() is None
    real = shutil.which("dot")
    if real:
        monkeypatch.setenv("TAPESCOPE_DOT", real)
        assert render.find_dot() == real


def test_viz_is_not_imported_by_core():
    code = "import sys, tapescope.core, tapescope; print([m for m in sys.modules if m.startswith('tapescope.viz') or m == 'graphviz'])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"\[\]\s*", proc.stdout)
