"""``make demo`` (``python -m tapescope.demo``): lazy evaluation, step by step, in plain text.

Builds a small expression, shows that building it ran nothing, prints the graph it
recorded, evaluates it, prints what ran, and shows that the result has let go of its graph.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import tapescope
import tapescope.core as mx


def _shape(shape: tuple) -> str:
    return str(tuple(shape))


def graph_lines(*outputs: mx.array) -> list[str]:
    """The lazy graph under ``outputs`` as text, one line per array, inputs first."""
    names: dict[int, str] = {}
    lines: list[str] = []

    def visit(desc: Any) -> str:
        if id(desc) in names:
            return names[id(desc)]
        node = desc.node
        args = [visit(d) for d in node.inputs] if node is not None else []
        name = names[id(desc)] = f"a{len(names)}"
        what = (f"{node.primitive.name}({', '.join(args)})" if node is not None
                else "input (data, nothing to compute)")
        lines.append(f"  {name} = {what:<34} shape={_shape(desc.shape):<8} dtype={desc.dtype.name}")
        return name

    for out in outputs:
        visit(out._d)
    return lines


def primitive_records(records: list) -> list:
    """The records of primitive runs among ``records``."""
    return [r for r in records if r.kind == "primitive"]


def main() -> None:
    """Run the demo, printing each step."""
    print("tapescope: an MLX-style lazy array runtime (import tapescope.core as mx)\n")

    print("1. Build an expression. Nothing is computed yet: each op only records a node.")
    print("     x = mx.array([[1., 2., 3.], [4., 5., 6.]])")
    print("     b = mx.array([10., 20., 30.])")
    print("     y = mx.exp(x * 0.5) + b\n")
    with tapescope.record() as building:
        x = mx.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        b = mx.array([10.0, 20.0, 30.0])
        h = mx.exp(x * 0.5)
        y = h + b
    ran = primitive_records(building.records)
    print(f"   Primitives run while building: {len(ran)}")
    print(f"   Is y evaluated? {y._d.node is None}\n")

    print("2. The graph y stands for (one line per array: the MLX primitive that makes it,")
    print("   its inputs, shape and dtype). The scalar 0.5 became an array broadcast to x's shape.")
    for line in graph_lines(y):
        print(line)
    print()

    watch = weakref.ref(h._d)  # the intermediate exp(x * 0.5), held by y's graph
    del h
    gc.collect()
    print(f"   The intermediate exp(x * 0.5) is kept alive by the graph: {watch() is not None}\n")

    print("3. Evaluate: mx.eval(y) runs every node in order.")
    with tapescope.record() as evaluating:
        mx.eval(y)
    ran = primitive_records(evaluating.records)
    print(f"   Primitives run: {len(ran)}")
    for r in ran:
        us = (r.end_ns - r.start_ns) / 1000
        print(f"     node #{r.node:<4} {r.name:<10} on {r.device} stream {r.stream}: "
              f"{r.nbytes:>4} bytes out, {us:8.1f} us")
    print()

    print("4. The result:")
    print("   " + repr(y).replace("\n", "\n   "))
    print()

    gc.collect()
    print("5. Evaluating detached y from its graph:")
    print(f"   Is y evaluated? {y._d.node is None}")
    print(f"   Is the intermediate exp(x * 0.5) still alive? {watch() is not None}")
    with tapescope.record() as again:
        mx.eval(y)
        print("   " + str(y.tolist()))
    print(f"   Primitives run by evaluating y again and reading it: "
          f"{len(primitive_records(again.records))}")


if __name__ == "__main__":
    main()
