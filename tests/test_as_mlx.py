"""tapescope.as_mlx(): MLX's own mlx.nn, mlx.optimizers and mlx.utils running on tapescope.

The routing of ``mlx.core`` is process-wide, so every case runs in a subprocess
(tests/as_mlx_cases.py): each layer, loss, optimizer run and saved model runs first on real
MLX, then, after ``as_mlx()``, on tapescope with MLX's parameters loaded, and the outputs are
compared here. ``AS_MLX_STEPS`` sets the MLP's training steps (100 by default).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import as_mlx_cases as cases
from conftest import mlx_ref

pytestmark = pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed: as_mlx() runs "
                                                         "MLX's own mlx.nn / mlx.optimizers")
HERE = os.path.dirname(os.path.abspath(__file__))


def _python(args, code=None, env=None):
    cmd = [sys.executable] + (["-c", textwrap.dedent(code)] if code else args)
    return subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, timeout=600,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    proc = _python(["as_mlx_cases.py", "layers", "losses", "optimizers", "tree", "safetensors",
                    "mlp"], env={"AS_MLX_TMP": str(tmp_path_factory.mktemp("as_mlx"))})
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = {}
    for line in proc.stdout.splitlines():
        rec = json.loads(line)
        out[rec["name"]] = rec
    return out


def _result(results, name):
    assert name in results, f"{name} did not run"
    rec = results[name]
    assert "error" not in rec, rec["error"]
    return rec


def _layer_names():
    if mlx_ref is None:
        return []
    import mlx.nn as nn

    return list(cases.LAYERS) + cases._activation_names(nn)


def test_every_layer_of_mlx_nn_is_a_case_or_has_a_reason():
    import inspect

    import mlx.nn as nn

    layers = {n for n, c in vars(nn).items() if inspect.isclass(c) and issubclass(c, nn.Module)}
    assert layers - set(_layer_names()) == set(cases.NOT_HERE)


@pytest.mark.parametrize("name", _layer_names())
def test_layer_forward_and_gradient_equal_mlx(results, name):
    """Output, and the gradient of a weighted sum of it for the parameters and the input."""
    rec = _result(results, "layer:" + name)
    assert rec["err"] <= 1e-5 * max(1.0, rec["scale"]), rec


@pytest.mark.parametrize("name", [n for n, _ in cases.loss_cases()])
def test_loss_equals_mlx(results, name):
    rec = _result(results, name)
    assert rec["err"] <= 1e-5 * max(1.0, rec["scale"]), rec


@pytest.mark.parametrize("name", list(cases.OPTIMIZERS))
def test_optimizer_ten_steps_equal_mlx(results, name):
    rec = _result(results, "optim:" + name)
    assert rec["rel"] <= 1e-5, rec


def test_compiled_training_step_with_captured_state_equals_mlx(results):
    rec = _result(results, "compiled_step")
    assert rec["err"] <= 1e-5 * max(1.0, rec["scale"]), rec


@pytest.mark.parametrize("name", list(cases.INITS))
def test_initializer_draws_equal_mlx(results, name):
    """Same seed, same draws: tapescope's random follows MLX's generator."""
    rec = _result(results, "init:" + name)
    assert rec["err"] <= 1e-6 * max(1.0, rec["scale"]), rec


@pytest.mark.parametrize("name", ["set_dtype", "freeze_checkpoint"])
def test_module_utilities_equal_mlx(results, name):
    rec = _result(results, "module:" + name)
    assert rec["err"] <= 1e-5 * max(1.0, rec["scale"]), rec


def test_tree_utils_on_tapescope_arrays(results):
    rec = _result(results, "tree")
    assert rec["err"] == 0.0
    assert rec["array_types"] == ["tapescope.core.array"]


def test_model_saved_by_mlx_loads_and_gives_the_same_outputs(results):
    rec = _result(results, "safetensors")
    assert rec["err"] <= 1e-6 * max(1.0, rec["scale"]), rec


@pytest.mark.parametrize("name", ["mlp_curve", "cnn_curve"])
def test_mlp_and_cnn_train_with_mlxs_loss_curve(results, name):
    rec = _result(results, name)
    ours, theirs = np.array(rec["tapescope"]), np.array(rec["mlx"])
    print(f"\n{name}\nstep  mlx           tapescope")
    for i in range(0, len(ours), 10):
        print(f"{i:4d}  {theirs[i]:.8f}  {ours[i]:.8f}")
    assert len(ours) == int(os.environ.get("AS_MLX_STEPS", "100"))
    assert theirs[-1] < 0.1 * theirs[0]  # it trained
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)


def test_routing_before_mlx_import_and_back_and_the_magic():
    proc = _python(None, """
        import sys
        import tapescope
        from tapescope.magic import mlx_line
        mlx_line(None, "as-mlx")
        import mlx.core as mx, mlx.nn as nn, mlx.optimizers as optim
        import mlx.core.linalg, mlx.core.fast, mlx.core.random
        assert mx is sys.modules["tapescope.core"], mx
        assert sys.modules["mlx.core.fast"] is mx.fast and mx.__version__ == "0.32.4"
        y = nn.Linear(3, 2)(mx.ones((1, 3)))
        assert type(y).__module__ == "tapescope.core.array", type(y)
        nn_held = nn
        mlx_line(None, "as-mlx off")
        import mlx.core as real
        assert real.__name__ == "mlx.core" and type(real.ones(1)).__module__ == "mlx.core"
        assert type(nn_held.Linear(3, 2).weight).__module__ == "mlx.core"
        tapescope.as_mlx()
        assert type(nn_held.Linear(3, 2).weight).__module__ == "tapescope.core.array"
        assert type(optim.Adam(0.1).learning_rate).__module__ == "tapescope.core.array"
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_a_module_that_cannot_be_reimported_leaves_the_routing_as_it_was():
    proc = _python(None, """
        import sys, types
        import mlx.core, mlx.nn
        sys.modules["mlx.not_a_file"] = types.ModuleType("mlx.not_a_file")  # cannot re-import
        import tapescope
        try:
            tapescope.as_mlx()
        except RuntimeError as err:
            print(err)
        import mlx.core as mx
        assert mx.__name__ == "mlx.core" and type(mlx.nn.Linear(2, 2).weight).__module__ == "mlx.core"
        assert "mlx.not_a_file" in sys.modules
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "as_mlx(True): re-importing MLX's modules under the new mlx.core failed" in proc.stdout


def test_without_mlx_as_mlx_says_what_to_install():
    proc = _python(None, """
        import sys
        class NoMLX:
            def find_spec(self, name, path=None, target=None):
                if name == "mlx" or name.startswith("mlx."):
                    raise ModuleNotFoundError(f"No module named {name!r}")
        sys.meta_path.insert(0, NoMLX())
        import tapescope
        try:
            tapescope.as_mlx()
        except ImportError as err:
            print(err)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pip install 'tapescope[mlx]'" in proc.stdout, proc.stdout


def test_magic_rejects_an_unknown_argument():
    from tapescope.magic import mlx_line

    with pytest.raises(Exception, match="expected 'on' or 'off'"):
        mlx_line(None, "as-mlx maybe")


_TRAINING_SETUP = """
import mlx.core as mx, mlx.nn as nn, mlx.optimizers as optim
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
mx.eval(model.parameters())
opt = optim.SGD(learning_rate=0.1)
loss_and_grad = nn.value_and_grad(
    model, lambda m, x, y: nn.losses.cross_entropy(m(x), y, reduction="mean"))
x = mx.random.normal((16, 4)); y = mx.random.randint(0, 2, (16,))
mx.eval(x, y)
"""


def test_mlx_cell_on_a_training_step_shows_forward_and_backward():
    """``%%mlx`` over an mlx.nn training step (after ``%mlx as-mlx``) draws the step's graph
    (the loss and a gradient it left lazy) with its forward ops and the backward ops reverse
    mode recorded, marked as such."""
    proc = _python(None, """
        from IPython.testing.globalipapp import start_ipython
        from IPython.utils.capture import capture_output
        from tapescope import magic
        SETUP = %r
        ip = start_ipython()
        ip.run_line_magic("load_ext", "tapescope")
        ip.run_line_magic("mlx", "as-mlx")
        ip.run_cell(SETUP)
        with capture_output() as cap:
            ip.run_cell("%%%%mlx\\nloss, grads = loss_and_grad(model, x, y)\\n"
                        "g = grads['layers'][0]['weight']\\nopt.update(model, grads)\\n")
        html = "".join(o.data.get("text/html", "") for o in cap.outputs)
        rep = magic.last_report()
        for title, g in rep.run.graphs:
            fwd = sum(not op.backward for op in g.ops)
            bwd = sum(op.backward for op in g.ops)
            print(title, fwd, bwd, bool({"Matmul", "AddMM"} & {op.primitive for op in g.ops}))
        print("svg", "<svg" in html)
    """ % _TRAINING_SETUP)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "svg True", proc.stdout
    counts = [line.rsplit(" ", 3)[1:] for line in lines[:-1]]
    assert any(int(f) > 0 and int(b) > 0 and m == "True" for f, b, m in counts), proc.stdout
