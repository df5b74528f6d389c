"""The roofline picture: every kernel that ran placed against its device's limits.

x: arithmetic intensity (FLOPs per byte moved), y: FLOP/s achieved, both logarithmic; per
device, the roof is min(copy bandwidth x intensity, peak FLOP/s) (the facts:
``kernels/roofline.py``). A kernel on the slanted roof moves bytes as fast as a copy; one
far below it says why in its hover and in the table beside the figure. Kernels that count
no FLOPs (pure data movement) are in the table only.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from .theme import esc, fmt_bytes, fmt_ns, plot_html, short_name, table

__all__ = ["roofline_figure", "roofline_table", "roofline_html"]

_COLOURS = {"cpu": "#2563eb", "gpu": "#16a34a"}


def _pct(x: Optional[float]) -> str:
    return "—" if x is None else f"{x:.0%}"


def roofline_figure(placed: Sequence[Any], widget: bool = False) -> Any:
    """The plotly figure (a FigureWidget when ``widget``), or None without plotly or without
    a kernel that counts FLOPs."""
    pts = [p for p in placed if p.launch.intensity and p.launch.flops_per_s]
    if not pts:
        return None
    try:
        import plotly.graph_objects as go

        fig = go.FigureWidget() if widget else go.Figure()
    except Exception:  # noqa: BLE001 - plotly or anywidget missing: the table only
        return None
    xs = [p.launch.intensity for p in pts]
    lo, hi = min(xs) / 4, max(max(xs) * 4, 1.0)
    for dev in dict.fromkeys(p.launch.device for p in pts):
        m = next(p.machine for p in pts if p.launch.device == dev)
        if m is None or not m.copy_bytes_per_s:
            continue
        peak = m.peak("float32")
        bw = m.copy_bytes_per_s
        knee = peak / bw if peak else hi
        roof_x = [lo, min(max(knee, lo), hi * 16), hi * 16]
        roof_y = [bw * x if not peak else min(bw * x, peak) for x in roof_x]
        fig.add_scatter(x=roof_x, y=roof_y, mode="lines", name=f"{dev} roof ({m.name})",
                        line=dict(color=_COLOURS.get(dev, "#6b7280"), width=2),
                        hovertemplate=(f"copy {bw / 1e9:.1f} GB/s"
                                       + (f", float32 peak {peak / 1e9:.0f} GFLOP/s" if peak else "")
                                       + "<extra>" + esc(m.how) + "</extra>"))
    number = {id(p): i + 1 for i, p in enumerate(placed)}  # the table's row numbers
    for dev in dict.fromkeys(p.launch.device for p in pts):
        for at, what, symbol in ((True, "at the roof", "circle"), (False, "below it", "diamond")):
            mine = [p for p in pts if p.launch.device == dev and (not p.why) == at]
            if not mine:
                continue
            fig.add_scatter(
                x=[p.launch.intensity for p in mine], y=[p.launch.flops_per_s for p in mine],
                mode="markers+text", name=f"{dev} kernels {what} ({len(mine)})",
                text=[str(number[id(p)]) for p in mine], textposition="middle right",
                marker=dict(size=11, symbol=symbol, color=_COLOURS.get(dev, "#6b7280") if at else "#f59e0b",
                            line=dict(width=1, color="#111827")),
                customdata=[_hover(p) for p in mine], hovertemplate="%{customdata}<extra></extra>")
    fig.update_layout(height=320, margin=dict(l=60, r=10, t=30, b=45), autosize=True,
                      xaxis=dict(type="log", title="FLOPs per byte"),
                      yaxis=dict(type="log", title="FLOP/s"), template="plotly_white",
                      # inside, bottom right: the kernels sit at the left, the modebar at the top
                      legend=dict(orientation="v", x=0.99, xanchor="right", y=0.02, yanchor="bottom",
                                  font=dict(size=11), bgcolor="rgba(255,255,255,0.85)",
                                  bordercolor="#d1d5db", borderwidth=1))
    return fig


def _hover(p: Any) -> str:
    x = p.launch
    return (f"{esc(short_name(x.title, 48))}<br>{fmt_ns(x.time_s * 1e9)}, {fmt_bytes(x.nbytes)} moved: "
            f"{x.bytes_per_s / 1e9:.1f} GB/s = {_pct(p.bandwidth_fraction)} of copy bandwidth"
            f"<br>{(x.flops_per_s or 0) / 1e9:.2f} GFLOP/s = {_pct(p.peak_fraction)} of peak"
            + (f"<br>{esc(p.why)}" if p.why else ""))


def roofline_table(placed: Sequence[Any]) -> str:
    """One row per kernel: time, bytes read / written, GB/s and its fraction of the copy
    bandwidth, its fraction of peak FLOP/s (the GFLOP/s are in the figure's hover), and why
    it is far from the roof; a device column when kernels of several devices ran."""
    devices = len({p.launch.device for p in placed}) > 1
    rows = []
    for i, p in enumerate(placed):
        x = p.launch
        rows.append((i + 1, f"<span title='{esc(x.name)}'>{esc(short_name(x.title, 36))}</span>",
                     *((x.device,) if devices else ()), p.launches, fmt_ns(x.time_s * 1e9),
                     fmt_bytes(x.bytes_read), fmt_bytes(x.bytes_written), f"{x.bytes_per_s / 1e9:.1f}",
                     _pct(p.bandwidth_fraction), _pct(p.peak_fraction), p.why or "at the roof"))
    head = ["#", "kernel", *(("device",) if devices else ()), "runs", "time", "read", "written",
            "GB/s", "% copy bw", "% peak", "why"]
    return table(head, rows, "ts-roofline", raw=(1,))


def roofline_html(placed: Sequence[Any], figure: bool = True) -> str:
    """The figure (plotly's static HTML, when ``figure``), the machines' limits and the
    table; "" without kernels."""
    if not placed:
        return ""
    machines = {p.launch.device: p.machine for p in placed if p.machine is not None}
    limits = "; ".join(f"{esc(d)} ({esc(m.name)}): copy {m.copy_bytes_per_s / 1e9:.1f} GB/s, float32 peak "
                       f"{(m.peak('float32') or 0) / 1e9:.0f} GFLOP/s" for d, m in machines.items())
    notes = "".join(f"<p class='ts-muted' title='{esc(m.how)}'>{esc(d)}: {esc(m.note)}.</p>"
                    for d, m in machines.items() if m.note)
    fig = plot_html(roofline_figure(placed)) if figure else ""
    return (f"<div class='ts-roofline-view'><p><b>Roofline</b>: {len(placed)} kernel(s) against "
            f"{limits} (hover a kernel; # is its row)</p>{fig}{roofline_table(placed)}{notes}</div>")
