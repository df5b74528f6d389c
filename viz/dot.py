"""Graph -> DOT: the picture of a traced graph, its fused kernels and their tapes.

Inputs and constants are boxes holding their shape and dtype; ops are coloured by primitive
family; intermediate arrays are the edges, labelled with shape and dtype; each fused kernel
is a cluster holding its tape (kernel name and variant in its label) and every edge into it
says, in red, why fusion stopped there. Evaluated arrays are drawn solid, lazy ones dashed.
Node ids are local to the graph (``v3``, ``op7``, ``k0_E``), so the same graph always gives
byte-identical DOT. A fused kernel's cluster (or box) has the SVG id ``ts_kernel_<index>``
and its tape's nodes ``ts_kernel_<index>_<letter>``: the ``%%mlx`` Graph tab makes them
clickable (``viz/pick.py``). The DOT is built with the ``graphviz`` library (``Digraph``), which also
quotes every name and attribute.
"""

from __future__ import annotations

from typing import Any, Optional

from . import style as S

__all__ = ["to_dot"]

BIG = 150  # drawn nodes past which layout shortcuts apply
FANOUT = 4  # uses past which a value of a big picture is drawn as stubs

_PARAM_KEYS = ("axes", "axis", "shape", "dtype", "reduce_type", "kth", "k")


def _shape(shape: tuple) -> str:
    return str(tuple(int(s) for s in shape))


def _value_text(v: Any, shapes: bool, dtypes: bool) -> str:
    parts = []
    if shapes:
        parts.append(_shape(v.shape))
    if dtypes:
        parts.append(v.dtype)
    return " ".join(parts)


def _literal(x: Any) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        return repr(x)
    return str(x)


def _scalar_text(v: Any) -> Optional[str]:
    """The value of a one-element constant, for its label."""
    if v.data is None or v.data.size != 1:
        return None
    x = v.data.reshape(()).item() if v.data.dtype.kind != "V" else float(v.data.reshape(()).astype("float32"))
    if v.dtype == "bfloat16":
        x = float(v.data.reshape(()).astype("float32"))
    return _literal(x)


def _param_text(op: Any) -> str:
    """A short summary of the parameters a reader needs (axes, shapes, target dtype)."""
    out = []
    for k in _PARAM_KEYS:
        if k in op.params:
            val = op.params[k]
            if k == "dtype":
                val = getattr(val, "name", val)
            out.append(f"{k}={val}")
    text = " ".join(str(t) for t in out)
    return text if len(text) <= 40 else text[:39] + "…"


def _tooltip(op: Any) -> str:
    items = [f"{k}={v!r}" for k, v in sorted(op.params.items()) if k != "tape"]
    text = f"{op.primitive} ({op.family})" + ("\n" + "\n".join(items) if items else "")
    return text if len(text) <= 300 else text[:299] + "…"


def _short(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters: its head, an ellipsis, its tail."""
    if len(text) <= width:
        return text
    head = (width - 1) * 2 // 3
    return text[:head] + "…" + text[-(width - 1 - head):]


def _wrap(text: str, width: int) -> list:
    return [text[i:i + width] for i in range(0, len(text), width)] or [""]


def _attrs(**kw: Any) -> dict:
    """Attributes for ``Digraph.node``/``edge``/``attr``: None dropped, values as strings, a
    line break in plain text written as DOT's ``\\n`` (HTML-like ``<...>`` labels kept as is)."""
    out = {}
    for k, v in kw.items():
        if v is None:
            continue
        v = str(v)
        if not (v.startswith("<") and v.endswith(">")):
            v = v.replace("\\", "\\\\").replace("\n", "\\n")
        out[k] = v
    return out


class _Writer:
    def __init__(self, graph: Any, rankdir: str, shapes: bool, dtypes: bool, max_nodes: Optional[int],
                 expand_kernels: bool, kernel_names: bool, legend: bool, title: bool):
        if rankdir not in ("TB", "LR", "BT", "RL"):
            raise ValueError(f"[to_dot] rankdir must be one of TB, LR, BT, RL, not {rankdir!r}.")
        if max_nodes is not None and max_nodes < 1:
            raise ValueError(f"[to_dot] max_nodes must be positive or None, not {max_nodes}.")
        self.g = graph
        self.rankdir, self.shapes, self.dtypes = rankdir, shapes, dtypes
        self.max_nodes, self.expand = max_nodes, expand_kernels
        self.kernel_names, self.legend, self.title = kernel_names, legend, title
        self.dg: Any = None  # the graphviz.Digraph being built
        self.t: Any = None  # where nodes and edges go now (the digraph or a cluster)
        self.groups: list = []
        self.lazy = self.evaluated = False
        self.has_input = self.has_constant = False  # the legend names only what is drawn
        self.has_backward = False
        self.grouped = False  # kernels drawn as boxes because their tapes do not fit

    # -- which ops are drawn ----------------------------------------------------------
    def _cost(self, op: Any) -> int:
        if op.kernel is not None and self.expand:
            k = self.g.kernels[op.kernel]
            return len(k.tape.ops) + len(k.tape.inputs)
        return 1

    def _choose(self) -> tuple:
        """Ops to draw (the ones nearest the outputs when the graph is too big) and how many not."""
        ops = self.g.ops
        if self.max_nodes is None or sum(self._cost(o) for o in ops) <= self.max_nodes:
            return {o.id for o in ops}, 0
        if self.expand and self.g.kernels:  # first group each kernel's tape into one box
            self.expand, self.grouped = False, True
            if len(ops) <= self.max_nodes:
                return {o.id for o in ops}, 0
        kept: set = set()
        budget = self.max_nodes
        for op in reversed(ops):
            c = self._cost(op)
            if c > budget:
                break
            kept.add(op.id)
            budget -= c
        return kept, len(ops) - len(kept)

    # -- ids ----------------------------------------------------------------------------
    def _src(self, vid: int, dst: str) -> str:
        """The node an edge carrying value ``vid`` to node ``dst`` starts from."""
        v = self.g.values[vid]
        if v.producer is None:
            return self._leaf_id(vid, dst)
        op = self.g.ops[v.producer]
        if op.id not in self.kept:
            return "hidden"
        if op.kernel is not None and self.expand:
            k = self.g.kernels[op.kernel]
            return f"k{k.index}_{k.tape.outputs[v.index]}"
        return f"op{op.id}"

    def _edge_label(self, vid: int) -> Optional[str]:
        v = self.g.values[vid]
        text = _value_text(v, self.shapes, self.dtypes)
        op = self.g.ops[v.producer] if v.producer is not None else None
        if op is not None and len(op.outputs) > 1:
            text = f"[{v.index}] {text}".rstrip()
        return text or None

    # -- nodes --------------------------------------------------------------------------
    def _per_use(self, vid: int) -> bool:
        v = self.g.values[vid]
        return v.role == "constant" and v.data is not None and v.data.size == 1

    def _leaf_id(self, vid: int, dst: str) -> str:
        return f"v{vid}_{dst}" if self._per_use(vid) else f"v{vid}"

    def _leaf(self, vid: int, dst: str, drawn: set) -> None:
        nid = self._leaf_id(vid, dst)
        if nid not in drawn:
            drawn.add(nid)
            self._value_node(self.g.values[vid], nid)

    def _value_node(self, v: Any, nid: str) -> None:
        st = S.CONSTANT if v.role == "constant" else S.INPUT
        if v.role == "constant":
            self.has_constant = True
        else:
            self.has_input = True
        lazy = self._mark(v.evaluated)
        name = S.esc(v.name or f"v{v.id}")
        lit = _scalar_text(v) if v.role == "constant" else None
        head = f"<B>{name}</B>" + (f" = {S.esc(lit)}" if lit is not None else "")
        sub = _value_text(v, self.shapes, self.dtypes)
        label = f"<{head}<BR/><FONT POINT-SIZE=\"9\">{S.esc(sub)}</FONT>>" if sub else f"<{head}>"
        shape = "box"
        styles = ["rounded", "filled"] if v.role == "input" else ["filled"]
        if lazy:
            styles.append("dashed")
        seed = {}
        if getattr(v, "seed", False):  # where the cotangent flow starts
            self.has_backward = True
            seed = {"color": S.BACKWARD, "penwidth": "2.2", "tooltip": "the seed cotangent"}
        self.t.node(nid, **_attrs(**{**dict(label=label, shape=shape, style=",".join(styles),
                                            fillcolor=st.fill, color=st.border), **seed}))

    def _mark(self, evaluated: bool) -> bool:
        """Note a value's state for the legend; whether it is drawn lazy (dashed). A compiled
        function's program has placeholders: neither (solid, no legend row)."""
        if getattr(self.g, "program", False):
            return False
        if evaluated:
            self.evaluated = True
        else:
            self.lazy = True
        return not evaluated

    def _backward(self, op: Any) -> dict:
        """How an op reverse mode recorded differs: a thick magenta border (and the legend row)."""
        if not getattr(op, "backward", False):
            return {}
        self.has_backward = True
        return {"color": S.BACKWARD, "penwidth": "2.2"}

    def _op_node(self, op: Any) -> None:
        st = S.op_style(op.family)
        self._group(op.family)
        params = _param_text(op)
        bw = self._backward(op)
        name = ("&#8711; " if bw else "") + S.esc(op.primitive)
        label = f"<<B>{name}</B>" + (
            f"<BR/><FONT POINT-SIZE=\"8\">{S.esc(params)}</FONT>" if params else "") + ">"
        self.t.node(f"op{op.id}", **_attrs(**{**dict(label=label, shape="box", style="rounded,filled",
                                                     fillcolor=st.fill, color=st.border,
                                                     tooltip=_tooltip(op)), **bw}))

    def _group(self, family: str) -> None:
        g = S.group_of(family)
        if g not in self.groups:
            self.groups.append(g)

    def _kernel_caption(self, k: Any) -> str:
        n = len(k.tape.ops)
        head = f"<B>kernel {k.index}</B> · {S.esc(k.variant)} · {n} op{'s' if n != 1 else ''}"
        if self.shapes:
            head += f" · {S.esc(_shape(k.shape))}"
        if k.tier == "interpreted":  # a tiered first call ran it while its C builds
            head += " · <I>interpreted (C building)</I>"
        if not self.kernel_names:
            return head
        name = S.esc(_short(k.name, 36))  # the full name is the cluster's tooltip
        return f"{head}<BR/><FONT FACE=\"Courier\" POINT-SIZE=\"8\">{name}</FONT>"

    def _kernel_cluster(self, op: Any) -> None:
        k = self.g.kernels[op.kernel]
        cl = S.cluster_style(k.tape)
        self._group("compiled" if cl is S.CLUSTER else "compiled reduction")
        outer = self.t
        with outer.subgraph(name=f"cluster_k{k.index}") as c:
            self.t = c
            bw = self._backward(op)
            caption = ("&#8711; " if bw else "") + self._kernel_caption(k)
            c.attr("graph", **_attrs(label=f"<{caption}>", style="rounded,filled",
                                     fillcolor=cl.fill, color=bw.get("color", cl.border),
                                     penwidth=bw.get("penwidth", "1.5"),
                                     fontsize="10", labeljust="l", tooltip=f"{k.name}_{k.variant}",
                                     id=f"ts_kernel_{k.index}"))
            for x, inp in zip(k.tape.inputs, k.inputs):
                nid = f"k{k.index}_{x.name}"
                if inp.constant is not None:
                    self.has_constant = True
                    label = f"<<FONT POINT-SIZE=\"9\">{S.esc(x.name)} = {S.esc(_literal(inp.constant))}</FONT>>"
                    c.node(nid, **_attrs(label=label, shape="box", style="filled", fillcolor=S.CONSTANT.fill,
                                         color=S.CONSTANT.border, height="0.2",
                                         tooltip="constant inlined into the source",
                                         id=f"ts_kernel_{k.index}_{x.name}"))
                else:
                    c.node(nid, **_attrs(label=x.name, shape="circle", width="0.3", fixedsize="true",
                                         fontsize="9", style="filled", fillcolor="#ffffff",
                                         color=cl.border, id=f"ts_kernel_{k.index}_{x.name}"))
            cot = self._tape_cotangents(k) if bw else set()
            for t in k.tape.ops:
                st = S.op_style(_family(t.primitive))
                self._group(_family(t.primitive))
                nabla = "&#8711; " if t.name in cot else ""
                label = (f"<<B>{nabla}{S.esc(t.primitive)}</B> <FONT POINT-SIZE=\"8\" "
                         f"COLOR=\"#6b7280\">{S.esc(t.name)}</FONT>>")
                mark = {"color": S.BACKWARD, "penwidth": "2.2"} if t.name in cot else {}
                c.node(f"k{k.index}_{t.name}", **_attrs(**{**dict(
                    label=label, shape="box", style="rounded,filled", fillcolor=st.fill,
                    color=st.border, id=f"ts_kernel_{k.index}_{t.name}"), **mark}))
            for t in k.tape.ops:
                for a in t.inputs:
                    c.edge(f"k{k.index}_{a}", f"k{k.index}_{t.name}",
                           **({"color": S.BACKWARD} if a in cot else {}))
        self.t = outer

    def _boundary_label(self, inp: Any, vid: int, from_value_node: bool) -> str:
        reason = inp.reason or "boundary"
        parts = [f"<FONT COLOR=\"{S.BOUNDARY}\"><I>{S.esc(reason)}</I></FONT>"]
        sub = None if from_value_node else self._edge_label(vid)
        if sub:
            parts.append(S.esc(sub))
        return "<" + "<BR/>".join(parts) + ">"

    def _collapsed_kernel(self, op: Any) -> None:
        k = self.g.kernels[op.kernel]
        self._group("compiled" if k.tape.reduction is None else "compiled reduction")
        steps = "·".join(t.primitive for t in k.tape.ops)
        if len(steps) > 48:
            steps = steps[:47] + "…"
        bw = self._backward(op)
        tier = " · <I>interpreted (C building)</I>" if k.tier == "interpreted" else ""
        label = (f"<<B>{'&#8711; ' if bw else ''}kernel {k.index}</B> · {S.esc(k.variant)}{tier}"
                 f"<BR/><FONT POINT-SIZE=\"8\">{S.esc(steps)}</FONT>>")
        st = S.GROUPS["fused kernel" if k.tape.reduction is None else "fused reduction"]
        self.t.node(f"op{op.id}", **_attrs(label=label, shape="box", style="rounded,filled,bold",
                                           fillcolor=st.fill, color=bw.get("color", st.border),
                                           tooltip=f"{k.name}_{k.variant}", id=f"ts_kernel_{k.index}"))

    # -- edges ------------------------------------------------------------------------------
    def _find_shared(self) -> None:
        """Values used in many places of a big picture: drawn as a short stub at each use,
        since long edges fanning out across hundreds of ranks defeat dot's layout."""
        self.shared: set = set()
        if self.n_drawn <= BIG:
            return
        uses: dict = {}
        for op in self.g.ops:
            if op.id in self.kept:
                for vid in set(op.inputs):
                    if self.g.values[vid].producer is not None:
                        uses[vid] = uses.get(vid, 0) + 1
        self.shared = {vid for vid, n in uses.items() if n > FANOUT}

    def _connect(self, vid: int, dst: str, **attrs: Any) -> None:
        """An edge carrying value ``vid`` into node ``dst`` (through a stub where needed)."""
        src = self._src(vid, dst)
        if src == "hidden" or vid in self.shared:
            v = self.g.values[vid]
            what = "not drawn" if src == "hidden" else f"shared: op{v.producer}"
            prod = self.g.ops[v.producer].primitive if v.producer is not None else ""
            stub = f"s{vid}_{dst}"
            self.t.node(stub, **_attrs(label=f"… {prod} ({what})", shape="plaintext", fontsize="8",
                                       fontcolor=S.NOTE.border))
            attrs.setdefault("style", "dashed")
            src = stub
        self.t.edge(src, dst, **_attrs(**attrs))

    def _is_cotangent(self, vid: int) -> bool:
        """A value a backward op made, or the seed reverse mode started from."""
        v = self.g.values[vid]
        if getattr(v, "seed", False):
            return True
        return v.producer is not None and getattr(self.g.ops[v.producer], "backward", False)

    def _cotangent_edge(self, vid: int) -> dict:
        """A cotangent's edges are drawn in magenta."""
        return {"color": S.BACKWARD} if self._is_cotangent(vid) else {}

    def _tape_cotangents(self, k: Any) -> set:
        """Names in a fused tape that carry a cotangent: inputs that are cotangents and the
        ops computed from one (a forward op fused beside them stays unmarked)."""
        cot = {x.name for x, inp in zip(k.tape.inputs, k.inputs)
               if inp.constant is None and self._is_cotangent(inp.value)}
        for t in k.tape.ops:
            if any(a in cot for a in t.inputs):
                cot.add(t.name)
        return cot

    # -- the whole picture --------------------------------------------------------------
    def write(self) -> str:
        g = self.g
        self.kept, hidden = self._choose()
        import graphviz

        self.dg = self.t = graphviz.Digraph("tapescope")
        gattrs = dict(rankdir=self.rankdir, fontname=S.FONT, fontsize="11", nodesep="0.25",
                      ranksep="0.35", newrank="true", pad="0.15", labelloc="t", labeljust="l")
        if self.title or self.grouped:
            head = f"<B>{S.esc(g._headline())}</B>" if self.title else ""
            if self.grouped:
                head += (f"{'<BR/>' if head else ''}<FONT COLOR=\"{S.NOTE.border}\">each fused kernel is "
                         f"one box: their tapes would pass max_nodes={self.max_nodes}</FONT>")
            gattrs["label"] = f"<{head}>"
        if sum(self._cost(o) for o in g.ops if o.id in self.kept) > BIG:  # keep dot's layout time bounded on big pictures
            gattrs.update(nslimit="1", nslimit1="1", mclimit="0.5")
        self.dg.attr("graph", **_attrs(**gattrs))
        self.dg.attr("node", **_attrs(fontname=S.FONT, fontsize="10", penwidth="1.2", height="0.3",
                                    margin="0.1,0.04"))
        self.dg.attr("edge", **_attrs(fontname=S.FONT, fontsize="8", color=S.EDGE, fontcolor="#374151",
                                    arrowsize="0.6"))
        # leaf values (inputs, constants) get a node; a one-element constant gets one per use
        # (a shared literal drawn once would pull long edges across the whole picture)
        drawn: set = set()
        for op in g.ops:
            if op.id not in self.kept:
                continue
            k = g.kernels[op.kernel] if op.kernel is not None else None
            for i, vid in enumerate(op.inputs):
                if g.values[vid].producer is not None:
                    continue
                if k is not None and self.expand:
                    if k.inputs[i].constant is not None:
                        continue
                    dst = f"k{k.index}_{k.inputs[i].letter}"
                else:
                    dst = f"op{op.id}"
                self._leaf(vid, dst, drawn)
        for i, vid in enumerate(g.outputs):
            if g.values[vid].producer is None:
                self._leaf(vid, f"out{i}", drawn)
        if hidden:
            self.dg.node("hidden", **_attrs(
                label=f"<<B>… {hidden} earlier op{'s' if hidden != 1 else ''} not drawn</B><BR/>"
                      f"<FONT POINT-SIZE=\"9\">the graph has {len(g.ops)} ops; "
                      f"draw(max_nodes=None) shows them all</FONT>>",
                shape="note", style="filled,dashed", fillcolor=S.NOTE.fill, color=S.NOTE.border))
        for op in g.ops:
            if op.id not in self.kept:
                continue
            if op.kernel is not None and self.expand:
                self._kernel_cluster(op)
            elif op.kernel is not None:
                self._collapsed_kernel(op)
            else:
                self._op_node(op)
        # edges into ops
        self.n_drawn = sum(self._cost(o) for o in g.ops if o.id in self.kept)
        self._find_shared()
        for op in g.ops:
            if op.id not in self.kept:
                continue
            k = g.kernels[op.kernel] if op.kernel is not None else None
            for i, vid in enumerate(op.inputs):
                dst = f"op{op.id}" if not (k and self.expand) else f"k{k.index}_{k.inputs[i].letter}"
                from_node = g.values[vid].producer is None
                if k is not None and self.expand:
                    inp = k.inputs[i]
                    if inp.constant is not None:
                        continue
                    self._connect(vid, dst, label=self._boundary_label(inp, vid, from_node),
                                  color=S.BOUNDARY, penwidth="1.2")
                elif k is not None:
                    self._connect(vid, dst, label=self._boundary_label(k.inputs[i], vid, from_node),
                                  color=S.BOUNDARY)
                else:
                    self._connect(vid, dst, label=None if from_node else self._edge_label(vid),
                                  **self._cotangent_edge(vid))
        # outputs
        for i, vid in enumerate(g.outputs):
            v = g.values[vid]
            styles = "rounded,bold" + (",dashed" if self._mark(v.evaluated) else "")
            sub = _value_text(v, self.shapes, self.dtypes)
            name = S.esc(v.name or f"out{i}") if v.producer is not None else f"out {i}"
            label = f"<<B>{name}</B>" + (f"<BR/><FONT POINT-SIZE=\"9\">{S.esc(sub)}</FONT>" if sub else "") + ">"
            self.dg.node(f"out{i}", **_attrs(label=label, shape="box", style=styles, peripheries="2",
                                           color=S.OUTPUT.border))
            self._connect(vid, f"out{i}", **self._cotangent_edge(vid))
        if self.legend:
            self.dg.node("legend", **_attrs(label=S.legend_label(self.groups, self.lazy, self.evaluated,
                                                                bool(g.kernels) and self.expand,
                                                                self.has_input, self.has_constant,
                                                                self.has_backward),
                                          shape="box", style="rounded", color="#d1d5db", fontsize="9"))
        return self.dg.source


def _family(name: str) -> str:
    from tapescope.kernels.primitives import family_of

    return family_of(name)


def to_dot(graph: Any, rankdir: str = "TB", shapes: bool = True, dtypes: bool = True,
           max_nodes: Optional[int] = 500, expand_kernels: bool = True, kernel_names: bool = True,
           legend: bool = True, title: bool = True) -> str:
    """DOT text of a ``tapescope.Graph``.

    ``rankdir``: TB (top to bottom) or LR; ``shapes`` / ``dtypes``: write them on nodes and
    edges; ``max_nodes``: past this many drawn nodes only the ops nearest the outputs are drawn
    and a note says how many are not (None: draw all); ``expand_kernels``: draw each fused
    kernel's tape (else one box per kernel); ``kernel_names``: the full kernel name under each
    cluster; ``legend`` and ``title``.
    """
    return _Writer(graph, rankdir, shapes, dtypes, max_nodes, expand_kernels, kernel_names,
                   legend, title).write()
