"""MLX 0.32's streams and threads: a stream belongs to the thread that made it (evaluating its
work elsewhere raises RuntimeError), new_thread_unsafe_stream, new_thread_local_stream, and
mx.device_info(device); each scenario is run on MLX and on tapescope and compared."""

from __future__ import annotations

import threading

import pytest

import tapescope.core as mx
from conftest import mlx_ref, requires_mlx
from mlx_compare import outcome


def _in_thread(fn):
    """``fn()``'s outcome on a new thread: ('ok', value) or (exception type, message)."""
    box = []

    def run():
        try:
            box.append(("ok", fn()))
        except Exception as e:  # noqa: BLE001
            box.append((type(e), str(e)))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return box[0]


def _scenarios(m):
    """Each scenario on module ``m``: its outcome with the stream index spelled ``<i>``."""
    s = m.new_stream(m.cpu)
    u = m.new_thread_unsafe_stream(m.cpu)
    tl = m.new_thread_local_stream(m.cpu)
    made_here = m.add(m.array(1), m.array(2), stream=s)
    made_on_tl = m.add(m.array(1), m.array(2), stream=tl)
    on_unsafe = m.multiply(m.array(3), m.array(4), stream=u)

    def eval_other_threads_array():
        return m.add(made_here, 1).item()

    def use_stream_from_other_thread():
        return m.add(m.array(1), 2, stream=s).item()

    def default_set_to_foreign_stream():
        m.set_default_stream(s)
        return m.add(m.array(1), 2).item()

    def context_of_foreign_stream():
        with m.stream(s):
            return m.add(m.array(1), 2).item()

    def thread_local_here():
        return m.add(m.array(5), 1, stream=tl).item()

    def unsafe_anywhere():
        return (on_unsafe.item(), m.add(m.array(1), 2, stream=u).item())

    def synchronize_foreign():
        m.synchronize(s)
        return None

    out = {}
    for f in (eval_other_threads_array, use_stream_from_other_thread,
              default_set_to_foreign_stream, context_of_foreign_stream, thread_local_here,
              unsafe_anywhere, synchronize_foreign):
        kind, val = _in_thread(f)
        if isinstance(val, str):
            val = val.replace(f"Stream(cpu, {_index(s)})", "Stream(cpu, <s>)")
            for t in range(64):
                val = val.replace(f"Stream(cpu, {t})", "Stream(cpu, <other>)")
        out[f.__name__] = (kind.__name__ if isinstance(kind, type) else kind, val)
    out["thread_local_made_here_elsewhere"] = _in_thread(lambda: made_on_tl.item())[0].__name__
    out["owner_evaluates"] = (made_here.item(), made_on_tl.item())
    return out


def _index(s) -> int:
    return int(repr(s).rsplit(",", 1)[1].rstrip(")"))


@requires_mlx
def test_thread_ownership_of_streams_matches_mlx():
    ours, theirs = _scenarios(mx), _scenarios(mlx_ref)
    assert ours == theirs
    assert ours["eval_other_threads_array"] == ("RuntimeError", "There is no Stream(cpu, <s>) in current thread.")


@requires_mlx
def test_thread_local_stream_objects_match_mlx():
    for m in (mx, mlx_ref):
        tl = m.new_thread_local_stream(m.cpu)
        assert repr(tl).startswith("ThreadLocalStream(Device(cpu, 0), ")
        assert tl.device == m.Device(m.cpu)
        assert isinstance(tl, m.ThreadLocalStream)
        assert tl == tl and tl != m.new_thread_local_stream(m.cpu)
    for src in ("M.new_thread_local_stream(3)", "M.new_thread_unsafe_stream('cpu')",
                "M.set_default_stream(M.new_thread_local_stream(M.cpu))",
                "M.ThreadLocalStream()", "M.device_info(3)"):
        assert outcome(mx, src) == outcome(mlx_ref, src), src


@requires_mlx
@pytest.mark.parametrize("arg", ["M.cpu", "M.Device(M.cpu)", "None", "M.gpu"])
def test_device_info_takes_a_device(arg):
    src = f"M.device_info({arg})" if arg != "None" else "M.device_info()"
    assert outcome(mx, src) is None and outcome(mlx_ref, src) is None
    got, want = eval(src, {"M": mx}), eval(src, {"M": mlx_ref})
    assert set(got) == set(want)
    assert got.get("architecture") == want.get("architecture")


def test_each_thread_gets_its_own_thread_local_stream():
    tl = mx.new_thread_local_stream(mx.cpu)
    here = mx.add(mx.array(1), 1, stream=tl)
    there = []
    t = threading.Thread(target=lambda: there.append(mx.add(mx.array(1), 1, stream=tl)))
    t.start()
    t.join()
    mine, theirs = here._d.node.primitive.stream, there[0]._d.node.primitive.stream
    assert mine != theirs and mine.device == theirs.device
    with pytest.raises(RuntimeError, match="in current thread"):
        mx.eval(there[0])


_SINGULAR = [[1.0, 2.0], [2.0, 4.0]]
_LU_ERROR = ("RuntimeError", "[Inverse::eval_cpu] LU factorization failed with error code 2")


def _sync(m, s):
    """``m.synchronize(s)``'s outcome: (exception type name, message) or None."""
    try:
        m.synchronize(s)
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, str(e)
    return None


def _async_error_scenario(m):
    """Outcomes of ``synchronize`` after an asynchronous eval that fails (a singular
    matrix's inverse), then one that succeeds. The error is raised once: by the first
    ``synchronize``, or (MLX, when the failed task finished before the eval's next enqueue:
    a loaded machine) by ``async_eval`` itself, and the ``synchronize`` after it is clean."""
    a = m.linalg.inv(m.array(_SINGULAR), stream=m.cpu)
    try:
        m.async_eval(a)
        first = _sync(m, m.cpu)
    except Exception as e:  # noqa: BLE001
        first = type(e).__name__, str(e)
    out = [first, _sync(m, m.cpu)]  # raised once
    ok = m.linalg.inv(m.array([[2.0, 0.0], [0.0, 4.0]]), stream=m.cpu)
    m.async_eval(ok)
    return out + [_sync(m, m.cpu), ok.tolist()]


def test_synchronize_raises_an_asynchronous_evals_error_once():
    ours = _async_error_scenario(mx)
    assert ours == [_LU_ERROR, None, None, [[0.5, 0.0], [0.0, 0.25]]]
    if mlx_ref is not None:
        assert ours == _async_error_scenario(mlx_ref)


def test_an_asynchronous_error_reaches_the_streams_that_waited_on_it():
    # (MLX may also raise it at the consumer stream's next enqueue, depending on timing)
    s2 = mx.new_stream(mx.cpu)
    c = mx.add(mx.linalg.inv(mx.array(_SINGULAR), stream=mx.cpu), 1, stream=s2)
    mx.async_eval(c)
    assert [_sync(mx, s2), _sync(mx, mx.cpu), _sync(mx, s2)] == [_LU_ERROR, _LU_ERROR, None]


def test_a_failed_asynchronous_eval_stays_lazy_and_raises_when_read():
    a = mx.linalg.inv(mx.array([[1.0, 2.0], [2.0, 4.0]]), stream=mx.cpu)
    mx.async_eval(a)
    with pytest.raises(RuntimeError, match="LU factorization failed"):
        mx.synchronize(mx.cpu)
    with pytest.raises(RuntimeError, match="LU factorization failed"):
        a.tolist()
    mx.synchronize(mx.cpu)  # the read's error was raised by the read
