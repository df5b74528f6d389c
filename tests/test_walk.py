"""The one graph walker (``tapescope.core.walk.topological``) that scheduling, tracing, the
check, export and ``graph_of`` share: MLX's depth-first order, each node once, and the
callbacks that cut the walk and report leaves."""

from __future__ import annotations

import tapescope.core as mx
from tapescope.core.walk import topological


def _names(nodes):
    return [n.primitive.name for n in nodes]


def test_inputs_come_first_left_to_right_and_each_node_once():
    a = mx.array([1.0, 2.0])
    mx.eval(a)
    e = mx.exp(a)
    s = mx.sin(a)
    out = (e * s) + e  # e is read twice: visited once
    order = topological([out._d])
    assert _names(order) == ["Exp", "Sin", "Multiply", "Add"]
    assert len({id(n) for n in order}) == len(order)


def test_several_outputs_share_what_they_have_in_common():
    a = mx.array([1.0, 2.0])
    mx.eval(a)
    e = mx.exp(a)
    x, y = e + 1.0, e * 2.0
    order = topological([x._d, y._d])
    assert _names(order).count("Exp") == 1
    assert _names(order).index("Exp") < _names(order).index("Add")


def test_leaves_are_reported_where_they_are_reached_and_visit_interleaves():
    a, b = mx.array([1.0]), mx.array([2.0])
    mx.eval(a, b)
    out = mx.exp(a) + b
    seq = []
    topological([out._d], leaf=lambda d: seq.append(("leaf", d is a._d, d is b._d)),
                visit=lambda n: seq.append(("node", n.primitive.name)))
    assert seq == [("leaf", True, False), ("node", "Exp"), ("leaf", False, True), ("node", "Add")]


def test_a_cut_node_is_left_out_with_everything_above_it():
    a = mx.array([1.0])
    mx.eval(a)
    e = mx.exp(a)
    out = mx.sin(e) + 1.0
    cut = []

    def at_exp(d):
        if d.node.primitive.name == "Sin":
            cut.append(d.node.primitive.name)
            return True
        return False

    order = topological([out._d], cut=at_exp)
    assert cut == ["Sin"] and "Exp" not in _names(order) and "Sin" not in _names(order)


def test_an_evaluated_array_has_no_nodes():
    a = mx.array([1.0])
    mx.eval(a)
    assert topological([a._d]) == []
