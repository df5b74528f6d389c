"""DOT -> SVG / PNG / PDF with the ``graphviz`` Python library (``graphviz.pipe``), which runs
the graphviz ``dot`` program (the only hard requirement besides that library).

When ``dot`` is not installed, displaying a graph shows a short message with the install
command and the DOT text (never a traceback); asking for an image explicitly raises
``GraphvizNotFound``, whose message says the same and which IPython shows without a traceback.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from typing import Optional

__all__ = ["GraphvizNotFound", "RenderError", "find_dot", "install_hint", "render", "save",
           "mimebundle", "missing_message"]

FORMATS = ("svg", "png", "pdf")


class GraphvizNotFound(RuntimeError):
    """The graphviz ``dot`` program is not on PATH."""

    def _render_traceback_(self) -> list:  # IPython: show the message, not a traceback
        return [str(self)]


class RenderError(RuntimeError):
    """``dot`` ran but could not draw the graph."""

    def _render_traceback_(self) -> list:
        return [str(self)]


def find_dot() -> Optional[str]:
    """Path of the ``dot`` program, or None (``TAPESCOPE_DOT`` overrides the PATH search)."""
    override = os.environ.get("TAPESCOPE_DOT")
    if override:
        return override if os.path.isfile(override) and os.access(override, os.X_OK) else None
    return shutil.which("dot")


def install_hint() -> str:
    """The command that installs graphviz here (apt, dnf, brew, conda or winget)."""
    if sys.platform == "darwin":
        return "brew install graphviz"
    if sys.platform.startswith("win"):
        return "winget install graphviz"
    if os.environ.get("CONDA_PREFIX"):
        return "conda install -c conda-forge graphviz"
    for tool, cmd in (("apt-get", "sudo apt-get install -y graphviz"), ("dnf", "sudo dnf install -y graphviz"),
                      ("yum", "sudo yum install -y graphviz"), ("pacman", "sudo pacman -S graphviz"),
                      ("apk", "sudo apk add graphviz")):
        if shutil.which(tool):
            return cmd
    return "sudo apt-get install -y graphviz  (or: conda install -c conda-forge graphviz)"


def missing_message(dot_text: Optional[str] = None) -> str:
    """What to do when ``dot`` is missing, followed by the DOT text when given."""
    msg = ("tapescope.viz: the graphviz 'dot' program was not found, so the graph cannot be drawn.\n"
           f"Install it with:\n    {install_hint()}\n"
           "then display the graph again. (Any graphviz viewer can draw the DOT text below.)")
    if dot_text is not None:
        msg += "\n\n" + dot_text
    return msg


_pipe_lock = threading.Lock()  # the library's dot path is a module global (TAPESCOPE_DOT)


def _with_dpi(dot_text: str, dpi: Optional[int]) -> str:
    """The DOT text with ``dpi`` set on the graph (what ``dot -Gdpi=`` does)."""
    if dpi is None:
        return dot_text
    i = dot_text.find("{")
    return dot_text if i < 0 else f"{dot_text[:i + 1]}\n  graph [dpi={int(dpi)}]{dot_text[i + 1:]}"


def render(dot_text: str, fmt: str = "svg", dpi: Optional[int] = None) -> bytes:
    """The picture in ``fmt`` (svg, png or pdf) as bytes, drawn by ``dot`` through
    ``graphviz.pipe``."""
    if fmt not in FORMATS:
        raise ValueError(f"[render] format must be one of {', '.join(FORMATS)}, not {fmt!r}.")
    exe = find_dot()
    if exe is None:
        raise GraphvizNotFound(missing_message(dot_text))
    try:
        import graphviz
        from graphviz.backend import dot_command
    except ImportError:
        raise GraphvizNotFound("tapescope.viz: the graphviz Python package is missing; install it "
                               "with:\n    pip install graphviz\n\n" + dot_text) from None

    data = _with_dpi(dot_text, dpi).encode()
    try:
        with _pipe_lock:
            saved, dot_command.DOT_BINARY = dot_command.DOT_BINARY, exe
            try:
                return graphviz.pipe("dot", fmt, data, quiet=True)
            finally:
                dot_command.DOT_BINARY = saved
    except graphviz.ExecutableNotFound:
        raise GraphvizNotFound(missing_message(dot_text)) from None
    except graphviz.CalledProcessError as e:
        err = (e.stderr or b"").decode(errors="replace").strip() if isinstance(e.stderr, bytes) else str(e.stderr or "")
        raise RenderError(f"tapescope.viz: dot exited with {e.returncode}: {err}") from None
    except OSError as e:
        raise RenderError(f"tapescope.viz: running {exe} failed: {e}") from None


def save(dot_text: str, path: str) -> None:
    """Write the picture to ``path``; the extension picks DOT (.dot/.gv), SVG, PNG or PDF."""
    ext = os.path.splitext(os.fspath(path))[1].lower().lstrip(".")
    if ext in ("dot", "gv"):
        data = dot_text.encode()
    elif ext in FORMATS:
        data = render(dot_text, ext, dpi=144 if ext == "png" else None)
    else:
        raise ValueError(f"[save] Unknown picture format {ext!r}: use .dot, .gv, .svg, .png or .pdf.")
    with open(path, "wb") as f:
        f.write(data)


def _strip_prolog(svg: str) -> str:
    """The ``<svg>`` element alone (no XML declaration or DOCTYPE), for inline HTML."""
    i = svg.find("<svg")
    return svg[i:] if i >= 0 else svg


def mimebundle(dot_text: str, text: str) -> dict:
    """What a notebook shows: ``image/svg+xml`` plus ``text/plain``, or, without ``dot``, the
    install message and the DOT text as plain text."""
    if find_dot() is None:
        return {"text/plain": missing_message(dot_text)}
    try:
        svg = render(dot_text, "svg").decode()
    except RenderError as e:
        return {"text/plain": f"{e}\n\n{dot_text}"}
    return {"image/svg+xml": _strip_prolog(svg), "text/plain": text}
