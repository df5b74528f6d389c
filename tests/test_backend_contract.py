"""Every backend is a subclass of the one small contract (``kernels/backends.py``'s
``Backend``, listed in ``backends.CONTRACT``) and imports no other backend.

The contract is a few methods and declared facts, as MLX's is ``eval_cpu`` / ``eval_gpu`` and a
stream's ``new_stream`` / ``synchronize``: its size is asserted here, so a new hook is a
decision (this file and ``CONTRACT`` change together), not a drift. A backend defines no
public name of its own beyond the contract (what the layers above could come to ask of one
runtime only). A backend whose module imports what this machine lacks (CuPy, PyObjC's Metal)
is read with ``ast`` instead of imported.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from tapescope.kernels import backends
from test_layers import backend_of, imports

BACKENDS = {"cpu": ("tapescope.kernels.cpu.backend", "CpuBackend"),
            "cuda": ("tapescope.kernels.cuda.backend", "CudaBackend"),
            "metal": ("tapescope.kernels.metal.backend", "MetalBackend")}

# the contract's size: the methods a backend may override, then the facts it declares
METHODS = ("run_compiled", "rule_for", "launch_fused", "new_stream", "synchronize", "info",
           "machine", "to_device", "as_array", "memory_of", "owner", "import_host", "export")
FACTS = ("name", "device_type", "dialect", "reduction_tapes", "quiet", "event_type",
         "array_type", "device_context", "sequential_forms", "kernel_rules", "compiled_launch", "compiled_prebuild",
         "eager_kernel", "device_api", "xp", "allocator", "count")

ROOT = Path(__file__).parent.parent


def _class(name: str):
    module, cls = BACKENDS[name]
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError:  # a runtime whose module needs what this machine lacks
        return None


def _path(name: str) -> Path:
    return ROOT / "kernels" / Path(*BACKENDS[name][0].split(".")[2:]).with_suffix(".py")


def _read(name: str) -> ast.ClassDef:
    cls = BACKENDS[name][1]
    return next(n for n in ast.parse(_path(name).read_text()).body
                if isinstance(n, ast.ClassDef) and n.name == cls)


def _public_names(node: ast.ClassDef) -> set:
    """The public names a class body binds (methods, properties, attributes)."""
    names = set()
    for n in node.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(n.name)
        elif isinstance(n, ast.Assign):
            names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            names.add(n.target.id)
    return {n for n in names if not n.startswith("_")}


def _instance_names(node: ast.ClassDef) -> set:
    """The public ``self.x = ...`` attributes a class's methods set."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                        and t.value.id == "self" and not t.attr.startswith("_")):
                    out.add(t.attr)
    return out


def test_the_contract_is_this_size():
    assert backends.CONTRACT == {"methods": METHODS, "facts": FACTS}
    assert len(METHODS) == 13 and len(FACTS) == 17
    assert backends.Backend.__abstractmethods__ == {"run_compiled"}


def test_the_contract_lists_every_public_name_of_the_base():
    base = next(n for n in ast.parse((ROOT / "kernels" / "backends.py").read_text()).body
                if isinstance(n, ast.ClassDef) and n.name == "Backend")
    assert _public_names(base) | _instance_names(base) == set(METHODS) | set(FACTS)
    for m in METHODS:
        assert callable(getattr(backends.Backend, m)), m
    for f in FACTS[:-3]:  # the class's facts (xp, allocator, count are the instance's)
        assert hasattr(backends.Backend, f), f


def test_the_contract_is_abstract():
    assert inspect.isabstract(backends.Backend)
    with pytest.raises(TypeError, match="abstract"):
        backends.Backend()


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_each_backend_implements_the_contract_and_no_more(name):
    node = _read(name)
    assert [b.id for b in node.bases if isinstance(b, ast.Name)] == ["Backend"]
    own = _public_names(node) | _instance_names(node)
    # its own names: the contract's, plus a GPU's device index (CudaBackend.device_id)
    assert own - set(METHODS) - set(FACTS) <= {"device_id"}, sorted(own - set(METHODS) - set(FACTS))
    assert backends.Backend.__abstractmethods__ <= own
    cls = _class(name)
    if cls is None:
        names = {t.id: v.value for n in node.body if isinstance(n, ast.Assign)
                 for t in n.targets if isinstance(t, ast.Name) and isinstance(v := n.value, ast.Constant)}
        assert names.get("name") == name
        return
    assert issubclass(cls, backends.Backend) and cls is not backends.Backend
    assert not inspect.isabstract(cls), sorted(cls.__abstractmethods__)
    assert cls.name == name
    for method in backends.Backend.__abstractmethods__:
        assert getattr(cls, method) is not getattr(backends.Backend, method), method


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_no_backend_imports_another(name):
    folder = _path(name).parent
    crossed = [(p.name, line, m) for p in sorted(folder.glob("*.py"))
               for line, m in imports(p, ROOT) if backend_of(m) not in (None, name)]
    assert crossed == []


def test_the_cpu_backend_is_a_backend_like_the_others():
    cpu = backends.registered()["cpu"]
    assert type(cpu).__name__ == "CpuBackend" and type(cpu) is _class("cpu")
    # its compiled kernels are facts of its own, not the contract's defaults
    assert cpu.compiled_launch is not None and cpu.compiled_prebuild is not None
    assert cpu.kernel_rules and callable(cpu.run_compiled)
    # its own rule of a primitive is its kernel_rules' entry (rule_for's default)
    name = next(iter(cpu.kernel_rules))

    class Prim:
        pass

    p = Prim()
    p.name = name
    assert cpu.rule_for(p) is cpu.kernel_rules[name]


def test_a_backend_missing_run_compiled_cannot_be_made():
    class Half(backends.Backend):
        name = "half"

    with pytest.raises(TypeError, match="run_compiled"):
        Half()


def test_a_numpy_backend_declines_to_import_or_export_device_memory():
    cpu = backends.registered()["cpu"]
    with pytest.raises(TypeError, match=r"\[array\]"):
        cpu.import_host(None, None)
    with pytest.raises(TypeError, match=r"\[export\]"):
        cpu.export(None, None)


def test_a_result_over_memory_no_array_owns_is_copied_in_its_layout():
    """(The contract's ``copy`` is the array's own ``copy(order="K")``.) A rule's result
    viewing memory that no array owns (a bytearray's) is copied into the allocator: its
    values, dtype and column-major layout as numpy's, no memory shared."""
    import numpy as np

    import tapescope.core as mx
    from tapescope.core import evaluate
    from tapescope.core.array import ArrayDesc

    cpu = backends.registered()["cpu"]
    want = np.arange(24, dtype=np.float32).reshape(4, 6)
    raw = bytearray(want.tobytes())
    view = np.frombuffer(raw, np.float32).reshape(4, 6).T
    d = ArrayDesc(view.shape, mx.float32, mx.default_stream(mx.cpu))
    evaluate._store(view, d, [], None, cpu)
    assert not np.shares_memory(d.data, view) and d.buffer is not None
    np.testing.assert_array_equal(d.data, want.T)
    assert d.data.flags.f_contiguous and d.data.strides == want.T.copy(order="K").strides
