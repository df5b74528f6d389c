"""HTML whose marked elements can be clicked: an anywidget that shows ``value`` (HTML, SVG
included) and, when an element carrying ``data-pick="<key>"`` (a table row, a graphviz
cluster) is clicked, sets ``picked`` to its key in Python. The picked element gets the
``ts-picked`` class. Used for the cache widget's rows and the graph's fused kernels."""

from __future__ import annotations

import re

import anywidget
import traitlets

__all__ = ["PickHTML", "pickable_svg"]

_ESM = """
function render({ model, el }) {
  const mark = () => {
    const key = model.get("picked");
    el.querySelectorAll("[data-pick]").forEach((e) => {
      e.classList.toggle("ts-picked", e.getAttribute("data-pick") === key);
    });
  };
  const draw = () => { el.innerHTML = model.get("value"); mark(); };
  el.addEventListener("click", (ev) => {
    const t = ev.target.closest("[data-pick]");
    if (!t || !el.contains(t)) return;
    ev.preventDefault();
    model.set("picked", t.getAttribute("data-pick"));
    model.save_changes();
  });
  model.on("change:value", draw);
  model.on("change:picked", mark);
  draw();
}
export default { render };
"""


class PickHTML(anywidget.AnyWidget):
    """``value``: the HTML shown; ``picked``: the ``data-pick`` key of the element last
    clicked ("" for none; setting it from Python marks that element)."""

    _esm = _ESM
    value = traitlets.Unicode("").tag(sync=True)
    picked = traitlets.Unicode("").tag(sync=True)


# graphviz writes a cluster or node with an ``id`` attribute as <g id="..." class="...">
_GROUP = re.compile(r'<g id="(ts_kernel_(\d+)(?:_\w+)?)" class="(cluster|node)">')


def pickable_svg(svg: str, prefix: str = "") -> str:
    """A graphviz SVG whose fused kernels (the groups ``viz.dot`` gives the id
    ``ts_kernel_<index>``, and the nodes of its tape) are clickable: their ``data-pick`` is
    ``prefix`` + ``ts_kernel_<index>``."""
    return _GROUP.sub(lambda m: f'<g id="{m.group(1)}" class="{m.group(3)} ts-pick" '
                                f'data-pick="{prefix}ts_kernel_{m.group(2)}">', svg)
