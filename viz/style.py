"""How the picture looks: colours per primitive family, value styles, and the legend."""

from __future__ import annotations

from dataclasses import dataclass

FONT = "Helvetica"


@dataclass(frozen=True)
class Style:
    """Fill and border colours of one kind of node, and how the legend names it."""

    fill: str
    border: str
    legend: str


# Primitive families (the ``kind`` each op registers) grouped into what a reader tells apart.
FAMILY_GROUP = {
    "unary": "elementwise", "binary": "elementwise", "ternary": "elementwise",
    "multi_output": "multi-output",
    "astype": "broadcast / cast", "broadcast": "broadcast / cast",
    "reduce": "reduction", "scan": "scan",
    "shape": "shape / view", "indexing": "indexing",
    "matmul": "matmul", "creation": "creation", "random": "random",
    "sort": "sort", "fft": "fft / linalg", "linalg": "fft / linalg",
    "compiled": "fused kernel",
    "compiled reduction": "fused reduction",
}

GROUPS = {
    "elementwise": Style("#dbeafe", "#2563eb", "elementwise (fusable)"),
    "multi-output": Style("#e0e7ff", "#4338ca", "multi-output elementwise"),
    "broadcast / cast": Style("#e0f2fe", "#0284c7", "broadcast / cast (fusable)"),
    "reduction": Style("#ffedd5", "#ea580c", "reduction"),
    "scan": Style("#fef3c7", "#d97706", "scan"),
    "shape / view": Style("#ede9fe", "#7c3aed", "shape / view"),
    "indexing": Style("#f3e8ff", "#9333ea", "indexing"),
    "matmul": Style("#fee2e2", "#dc2626", "matmul"),
    "creation": Style("#fef9c3", "#ca8a04", "creation"),
    "random": Style("#fef9c3", "#a16207", "random"),
    "sort": Style("#ccfbf1", "#0d9488", "sort"),
    "fft / linalg": Style("#fce7f3", "#db2777", "fft / linalg"),
    "fused kernel": Style("#dcfce7", "#16a34a", "fused kernel (Compiled)"),
    "fused reduction": Style("#fff7ed", "#c2410c",
                             "fused reduction (extended fusion: a reduction and its neighbours)"),
    "other": Style("#f3f4f6", "#4b5563", "other"),
}

INPUT = Style("#fefce8", "#854d0e", "input (argument)")
CONSTANT = Style("#f5f5f4", "#78716c", "constant")
OUTPUT = Style("#ffffff", "#111827", "output")
CLUSTER = Style("#f0fdf4", "#16a34a", "fused kernel")
REDUCTION_CLUSTER = Style("#fff7ed", "#c2410c", "fused reduction")  # extended fusion's kernels


def cluster_style(tape: object) -> Style:
    """The colours of a fused kernel: extended fusion's reduction kernels have their own."""
    return REDUCTION_CLUSTER if getattr(tape, "reduction", None) is not None else CLUSTER
BOUNDARY = "#b91c1c"  # colour of the 'why fusion stopped' labels
EDGE = "#6b7280"
BACKWARD = "#c026d3"  # border of ops reverse mode recorded, and of the cotangents they pass
NOTE = Style("#fff7ed", "#9a3412", "not drawn")


def group_of(family: str) -> str:
    """The legend group of a primitive family (``unary`` -> ``elementwise``)."""
    return FAMILY_GROUP.get(family, "other")


def op_style(family: str) -> Style:
    """Colours of an op node of this family."""
    return GROUPS[group_of(family)]


def esc(text: object) -> str:
    """Text made safe inside an HTML-like DOT label."""
    return (str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def legend_label(groups: list, lazy: bool, evaluated: bool, kernels: bool, inputs: bool = True,
                 constants: bool = True, backward: bool = False) -> str:
    """An HTML table naming every kind of node the picture uses (only those it uses)."""
    rows = ['<TR><TD COLSPAN="2" ALIGN="LEFT"><B>legend</B></TD></TR>']

    def row(fill: str, border: str, text: str, dashed: bool = False) -> None:
        style = ' STYLE="DASHED"' if dashed else ""
        rows.append(f'<TR><TD BGCOLOR="{fill}" COLOR="{border}" BORDER="1"{style} WIDTH="18" '
                    f'HEIGHT="12" FIXEDSIZE="TRUE"></TD><TD ALIGN="LEFT">{esc(text)}</TD></TR>')

    if inputs:
        row(INPUT.fill, INPUT.border, INPUT.legend)
    if constants:
        row(CONSTANT.fill, CONSTANT.border, CONSTANT.legend)
    for g in groups:
        if g == "fused kernel" and kernels:
            continue  # the cluster row below says it
        st = GROUPS[g]
        row(st.fill, st.border, st.legend)
    if evaluated:
        row("#ffffff", "#111827", "evaluated (holds data): solid")
    if lazy:
        row("#ffffff", "#111827", "lazy (not computed yet): dashed", dashed=True)
    if backward:
        rows.append(f'<TR><TD COLOR="{BACKWARD}" BORDER="2" WIDTH="18" HEIGHT="12" FIXEDSIZE="TRUE">'
                    f'</TD><TD ALIGN="LEFT">backward (reverse mode): &#8711; ops, '
                    f'<FONT COLOR="{BACKWARD}">cotangent</FONT> edges</TD></TR>')
    if kernels:
        rows.append(f'<TR><TD BGCOLOR="{CLUSTER.fill}" COLOR="{CLUSTER.border}" BORDER="1" '
                    f'></TD><TD ALIGN="LEFT">fused kernel: its tape inside; '
                    f'<FONT COLOR="{BOUNDARY}"><I>red</I></FONT> = why fusion stopped</TD></TR>')
    return ('<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="3" CELLPADDING="2">'
            + "".join(rows) + "</TABLE>>")
