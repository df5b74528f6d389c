"""Progress bars: shown (through tqdm) for an eval longer than the threshold, not for a short
one; nodes done of total; kernel-build batches; the monitor's logic on synthetic records."""

from __future__ import annotations

import io
import re
import time

import numpy as np
import pytest

pytest.importorskip("tqdm")

import tapescope.core as mx  # noqa: E402
from tapescope import progress  # noqa: E402
from tapescope.kernels import primitives, timeline  # noqa: E402
from tapescope.kernels.settings import settings as ts_settings  # noqa: E402
from tapescope.kernels.timeline import Record  # noqa: E402

SLEEP = 0.05


@pytest.fixture
def slow_exp(monkeypatch):
    """Make every Exp node take SLEEP seconds (its definition restored after)."""

    def slow(xp, a, out=None):
        time.sleep(SLEEP)
        return np.exp(a)

    exp = primitives.lookup("Exp")
    monkeypatch.setattr(exp, "rule", slow)
    monkeypatch.setattr(exp, "takes_out", False)
    with ts_settings(eager_kernels=False):  # the slow rule runs, not a GPU's one-op kernel
        yield
    monkeypatch.undo()


def _chain(n: int):
    x = mx.array(np.float32([0.1]))
    for _ in range(n):
        x = mx.exp(x)
    return x


def _bars(text: str) -> list:
    """(done, total) of every tqdm status line in the captured text."""
    return [(int(a), int(b)) for a, b in re.findall(r"(\d+)/(\d+) \[", text)]


class _TimedText(io.StringIO):
    """Captured output that remembers when it was first written to."""

    first = None

    def write(self, s):
        if self.first is None and s:
            self.first = time.monotonic()
        return super().write(s)


def test_long_eval_shows_nodes_done_of_total(slow_exp):
    out = _TimedText()
    x = _chain(30)  # 30 nodes of at least 50 ms: 1.5 s or more
    with progress.progress(file=out) as mon:
        t0 = time.monotonic()
        mx.eval(x)
    text = out.getvalue()
    assert mon.shown == 1
    bars = _bars(text)
    assert bars and all(total == 30 for _, total in bars)
    assert bars[-1][0] == 30  # closed at the end, complete
    assert text.startswith("\reval:")  # tqdm's own format, with our description
    # the first bar appeared only once the eval had run for the threshold (a clock, not a
    # node count: on a loaded machine a 50 ms sleep takes longer, so fewer nodes are done)
    assert out.first - t0 >= progress.MIN_SECONDS


def test_short_eval_shows_nothing(slow_exp):
    out = io.StringIO()
    x = _chain(3)  # 0.15 s
    with progress.progress(file=out) as mon:
        mx.eval(x)
        time.sleep(0.3)  # the monitor polled several times meanwhile
    assert mon.shown == 0 and out.getvalue() == ""


def test_threshold_is_configurable_and_bar_goes_to_stderr_by_default(slow_exp, capsys):
    x = _chain(8)  # 0.4 s
    with progress.progress(min_seconds=0.1) as mon:
        mx.eval(x)
    assert mon.shown == 1
    assert (8, 8) in _bars(capsys.readouterr().err)


def test_enable_disable_turns_timeline_recording_on_and_off(slow_exp):
    was = timeline.enabled
    out = io.StringIO()
    mon = progress.enable(min_seconds=0.1, file=out)
    try:
        assert progress.is_enabled() and timeline.enabled
        mx.eval(_chain(6))
    finally:
        progress.disable()
    assert not progress.is_enabled() and timeline.enabled == was
    assert mon.shown == 1 and _bars(out.getvalue())[-1] == (6, 6)


def _rec(kind, t_s, **detail):
    return Record(kind, int(t_s * 1e9), int(t_s * 1e9), detail=detail)


def test_monitor_logic_on_synthetic_records():
    out = io.StringIO()
    m = progress.ProgressMonitor(min_seconds=1.0, file=out)
    m.feed([_rec("eval_begin", 0.0, nodes=10, streams=[0, 1])] + [_rec("primitive", 0.1)] * 4,
           now_ns=int(0.5e9))
    assert m.shown == 0  # not yet a second old
    m.feed([_rec("primitive", 0.6)] * 2, now_ns=int(1.2e9))
    assert m.shown == 1 and m.tasks[0].bar.n == 6 and m.tasks[0].bar.total == 10
    m.feed([_rec("eval_end", 1.3)], now_ns=int(1.3e9))
    assert len(m.tasks) == 1  # one of its two streams is still running
    m.feed([_rec("primitive", 1.3)] * 4 + [_rec("eval_end", 1.4)], now_ns=int(1.4e9))
    assert m.tasks == [] and (10, 10) in _bars(out.getvalue())


def test_kernel_batch_counts_builds_not_cache_hits():
    out = io.StringIO()
    m = progress.ProgressMonitor(min_seconds=1.0, file=out)
    m.feed([_rec("kernel_batch_begin", 0.0, kernels=3),
            _rec("kernel_build", 0.5, hit=False), _rec("kernel_build", 0.6, hit=True)],
           now_ns=int(1.5e9))
    assert m.shown == 1 and m.tasks[0].kind == "kernels" and m.tasks[0].bar.n == 1
    m.feed([_rec("kernel_build", 1.6, hit=False), _rec("kernel_build", 1.7, hit=False),
            _rec("kernel_batch_end", 1.8)], now_ns=int(1.8e9))
    assert m.tasks == []
    text = out.getvalue()
    assert "building kernels" in text and (3, 3) in _bars(text)


def test_short_kernel_batch_shows_nothing():
    out = io.StringIO()
    m = progress.ProgressMonitor(min_seconds=1.0, file=out)
    m.feed([_rec("kernel_batch_begin", 0.0, kernels=2), _rec("kernel_build", 0.1),
            _rec("kernel_build", 0.2), _rec("kernel_batch_end", 0.3)], now_ns=int(0.3e9))
    assert m.shown == 0 and m.tasks == [] and out.getvalue() == ""


def test_building_several_fused_kernels_shows_kernels_built_of_total(monkeypatch, tmp_path):
    """A real batch: one eval whose three Compiled nodes each build a C kernel (a fresh
    on-disk cache, so every build runs the compiler)."""
    import tapescope
    from tapescope.kernels.cpu import compiler

    if compiler.toolchain() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("TAPESCOPE_CACHE_DIR", str(tmp_path / "kcache"))
    tapescope.clear_kernel_cache()
    x = mx.array(np.linspace(0.1, 1, 64, dtype=np.float32))
    fns = [mx.compile(lambda a: mx.exp(a) * 2.0 + 1.0), mx.compile(lambda a: mx.sin(a) * a - 3.0),
           mx.compile(lambda a: mx.sqrt(a) + a * a * 0.5)]
    outs = [f(x) for f in fns]  # three lazy Compiled nodes
    out = io.StringIO()
    with progress.progress(min_seconds=0.2, file=out) as mon:
        mx.eval(outs)
    tapescope.clear_kernel_cache()
    text = out.getvalue()
    assert "kernels" in text, text
    bars = [b for b in _bars(text) if b[1] == 3]
    assert bars and bars[-1] == (3, 3)
    assert mon.shown >= 1
    np.testing.assert_allclose(np.array(outs[0]), np.exp(np.array(x)) * 2 + 1, rtol=1e-6)
