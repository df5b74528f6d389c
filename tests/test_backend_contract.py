"""Every backend is a subclass of the one contract (``kernels/backends.py``'s ``Backend``)
and writes what it leaves abstract; no backend is told apart by which methods it overrides.

A backend whose module imports what this machine lacks (CuPy, PyObjC's Metal) is read with
``ast`` instead: its class subclasses ``Backend`` and defines every abstract method. The
contract's abstract methods are found by ``abc``, so a backend missing one cannot be made.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from tapescope.kernels import backends

BACKENDS = {"cpu": ("tapescope.kernels.cpu.backend", "CpuBackend"),
            "cuda": ("tapescope.kernels.cuda.backend", "CudaBackend"),
            "metal": ("tapescope.kernels.metal.backend", "MetalBackend")}


ROOT = Path(__file__).parent.parent


def _class(name: str):
    module, cls = BACKENDS[name]
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError:  # a runtime whose module needs what this machine lacks
        return None


def _read(name: str) -> ast.ClassDef:
    module, cls = BACKENDS[name]
    path = ROOT / "kernels" / Path(*module.split(".")[2:]).with_suffix(".py")
    return next(n for n in ast.parse(path.read_text()).body
                if isinstance(n, ast.ClassDef) and n.name == cls)


def test_the_contract_is_abstract():
    assert inspect.isabstract(backends.Backend)
    assert "run_compiled" in backends.Backend.__abstractmethods__
    with pytest.raises(TypeError, match="abstract"):
        backends.Backend()


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_each_backend_implements_the_contract(name):
    cls = _class(name)
    if cls is None:
        node = _read(name)
        assert [b.id for b in node.bases if isinstance(b, ast.Name)] == ["Backend"]
        defined = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        assert backends.Backend.__abstractmethods__ <= defined
        names = {t.id: v.value for n in node.body if isinstance(n, ast.Assign)
                 for t in n.targets if isinstance(t, ast.Name) and isinstance(v := n.value, ast.Constant)}
        assert names.get("name") == name
        return
    assert issubclass(cls, backends.Backend) and cls is not backends.Backend
    assert not inspect.isabstract(cls), sorted(cls.__abstractmethods__)
    assert cls.name == name
    for method in backends.Backend.__abstractmethods__:
        assert getattr(cls, method) is not getattr(backends.Backend, method), method


def test_the_cpu_backend_is_a_backend_like_the_others():
    cpu = backends.registered()["cpu"]
    assert type(cpu).__name__ == "CpuBackend" and type(cpu) is _class("cpu")
    # its compiled kernels' hooks are its own, not the contract's defaults
    assert cpu.compiled_launch is not None and cpu.compiled_prebuild is not None
    assert cpu.kernel_rules


def test_a_backend_missing_run_compiled_cannot_be_made():
    class Half(backends.Backend):
        name = "half"

    with pytest.raises(TypeError, match="run_compiled"):
        Half()
