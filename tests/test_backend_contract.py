"""Every backend is a subclass of the one small contract (``kernels/backends.py``'s
``Backend``, listed in ``backends.CONTRACT``) and imports no other backend.

The contract is what evaluating needs, as MLX's is a primitive's ``eval_cpu`` / ``eval_gpu``
and the device's allocator, streams and events: its size is asserted here, so a new hook is
a decision (this file and ``CONTRACT`` change together), not a drift. A backend defines no
public name of its own beyond the contract (what the layers above could come to ask of one
runtime only), sets none of the derived ones (``quiet``), and its device context is a
``DeviceContext`` (the node's rule named there). The other side too: the layers above the
backends (the notebook layer, core, viz, kernels outside the backends' folders, and
core/_loop.c's ``BackendInfo``) ask a backend for nothing outside the contract. A planted
method and a planted question are reported. A backend
whose module imports what this machine lacks (CuPy, PyObjC's Metal) is read with ``ast``
instead of imported.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from tapescope.kernels import backends
from test_layers import backend_of, imports

BACKENDS = {"cpu": ("tapescope.kernels.cpu.backend", "CpuBackend"),
            "cuda": ("tapescope.kernels.cuda.backend", "CudaBackend"),
            "metal": ("tapescope.kernels.metal.backend", "MetalBackend")}

# the contract's size: the hooks a backend may write, the facts it declares, what follows
METHODS = ("run_compiled", "to_device", "launch_fused", "new_stream", "synchronize", "info",
           "machine")
FACTS = ("name", "device_type", "dialect", "reduction_tapes", "event_type", "array_type",
         "storage_type", "device_context", "sequential_forms", "kernel_rules", "compiled_launch",
         "compiled_prebuild", "eager_kernel", "device_api", "xp", "allocator")
DERIVED = ("quiet",)
# what left the contract, and where it went: a backend that defines one again fails
GONE = {"rule_for": "the device context's rule", "as_array": "to_device",
        "memory_of": "Allocator.memory_of", "owner": "Allocator.owner",
        "import_host": "Allocator.import_host", "export": "Allocator.export",
        "count": "one GPU per process (gpu_count)"}
# a backend's own names beyond the contract: a GPU's device index (CudaBackend.device_id)
OWN = {"device_id"}

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
    assert backends.CONTRACT == {"methods": METHODS, "facts": FACTS, "derived": DERIVED}
    assert len(METHODS) == 7 and len(FACTS) == 16 and len(DERIVED) == 1
    assert backends.Backend.__abstractmethods__ == {"run_compiled"}
    assert not set(GONE) & (set(METHODS) | set(FACTS) | set(DERIVED))


def test_the_contract_lists_every_public_name_of_the_base():
    base = next(n for n in ast.parse((ROOT / "kernels" / "backends.py").read_text()).body
                if isinstance(n, ast.ClassDef) and n.name == "Backend")
    assert _public_names(base) | _instance_names(base) == set(METHODS) | set(FACTS) | set(DERIVED)
    for m in METHODS:
        assert callable(getattr(backends.Backend, m)), m
    for f in FACTS[:-2]:  # the class's facts (xp, allocator are the instance's)
        assert hasattr(backends.Backend, f) == (f not in backends.DECLARED), f


def test_the_contract_is_abstract():
    assert inspect.isabstract(backends.Backend)
    with pytest.raises(TypeError, match="abstract"):
        backends.Backend()


def outside_contract(node: ast.ClassDef) -> list:
    """What a backend's class body defines beyond the contract: its own public names
    (``OWN`` aside), a derived name it sets, a device context not a ``DeviceContext``."""
    own = _public_names(node) | _instance_names(node)
    found = [f"{n}: not in the contract" + (f" (now {GONE[n]})" if n in GONE else "")
             for n in sorted(own - set(METHODS) - set(FACTS) - set(DERIVED) - OWN)]
    found += [f"{n}: derived, not declared" for n in sorted(own & set(DERIVED))]
    return found


def _device_context_type(module: ast.Module, node: ast.ClassDef):
    """The class a backend's ``device_context`` returns (its return annotation), or None."""
    fn = next((n for n in node.body if isinstance(n, ast.FunctionDef)
               and n.name == "device_context"), None)
    if fn is None:
        return None
    name = fn.returns.id if isinstance(fn.returns, ast.Name) else None
    return next((n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name),
                "unannotated")


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_each_backend_implements_the_contract_and_no_more(name):
    module = ast.parse(_path(name).read_text())
    node = _read(name)
    assert [b.id for b in node.bases if isinstance(b, ast.Name)] == ["Backend"]
    assert outside_contract(node) == []
    own = _public_names(node) | _instance_names(node)
    assert backends.Backend.__abstractmethods__ <= own
    ctx = _device_context_type(module, node)
    if ctx is not None:  # a GPU's: a DeviceContext, which names the node's rule
        assert ctx != "unannotated"
        assert [b.id for b in ctx.bases if isinstance(b, ast.Name)] == ["DeviceContext"], ctx.name
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


def test_a_planted_method_outside_the_contract_is_reported():
    source = _path("cpu").read_text()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef))
    assert outside_contract(cls) == []
    planted = source + ("\n    def memory_of(self, data):\n        return data\n"
                        "\n    quiet = None\n\n    def warm_up(self):\n        pass\n")
    cls = next(n for n in ast.parse(planted).body if isinstance(n, ast.ClassDef))
    assert outside_contract(cls) == ["memory_of: not in the contract (now Allocator.memory_of)",
                                     "warm_up: not in the contract", "quiet: derived, not declared"]


# -- what the layers above ask of a backend ------------------------------------------------
_LOOKUPS = {"backend", "stream_backend", "existing_stream_backend"}  # (kernels/backends.py)


def _lookup(node: ast.AST) -> bool:
    """Whether ``node`` is a call of a backend lookup (``backend(...)``, ``stream_backend``)."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute)
            else None) in _LOOKUPS


def asked_in(source: str) -> list:
    """(line, attribute) for every attribute a module asks of a backend: of a lookup's result
    (``backend("cpu").array_type``), of a name a function binds to one (``be =
    stream_backend(s)``), or of a function's ``be`` argument (the evaluator's convention)."""
    found = set()
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        args = fn.args.args + fn.args.kwonlyargs
        names = {a.arg for a in args if a.arg == "be"}
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign) and _lookup(n.value):
                names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
        for n in ast.walk(fn):
            if isinstance(n, ast.Attribute) and (
                    _lookup(n.value) or (isinstance(n.value, ast.Name) and n.value.id in names)):
                found.add((n.lineno, n.attr))
    return sorted(found)


def _asked_in_c(source: str) -> set:
    """What core/_loop.c reads off a backend (``BackendInfo``) and calls on it."""
    return (set(re.findall(r"PyObject_GetAttr\((?:bi->)?be, s_(\w+)\)", source))
            | set(re.findall(r"PyObject \*largs\[\d+\] = \{be, [^}]*\};\s*"
                             r"if \(call_none\(PyObject_VectorcallMethod\(s_(\w+)", source)))


def _asking_modules():
    """The modules above the backends: the notebook layer, core, viz and kernels' own
    modules outside the backends' folders."""
    for folder in ("interactive", "viz", "kernels"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if folder == "kernels" and len(rel.parts) > 2 and rel.parts[1] in BACKENDS:
                continue
            yield rel, path.read_text()


def test_the_layers_above_ask_a_backend_only_for_the_contract():
    contract = set(METHODS) | set(FACTS) | set(DERIVED)
    asked = {}
    for rel, source in _asking_modules():
        for line, attr in asked_in(source):
            asked.setdefault(attr, []).append(f"{rel}:{line}")
    c_asked = _asked_in_c((ROOT / "interactive" / "core" / "_loop.c").read_text())
    assert {k: v for k, v in asked.items() if k not in contract} == {}
    assert c_asked - contract == set()
    # the scan sees the evaluator's questions and the C loop's
    assert {"to_device", "allocator", "device_context", "run_compiled", "launch_fused"} <= set(asked)
    assert {"xp", "allocator", "array_type", "compiled_launch", "kernel_rules", "device_context",
            "device_api", "eager_kernel", "event_type", "launch_fused"} <= c_asked


def test_a_planted_question_outside_the_contract_is_reported():
    source = (ROOT / "interactive" / "core" / "evaluate.py").read_text()
    assert [a for _, a in asked_in(source) if a in GONE] == []
    planted = source + ("\n\ndef _planted(node):\n    be = stream_backend(node.primitive.stream)\n"
                        "    return be.memory_of(node), backend('cpu').rule_for(node)\n")
    assert sorted(a for _, a in asked_in(planted) if a in GONE) == ["memory_of", "rule_for"]


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
    # the host: no device context (its own rules are kernel_rules', run without one)
    assert cpu.device_context is None and cpu.device_api is None


def test_a_device_contexts_rule_is_the_rule_the_node_runs():
    """A GPU backend's device context names the node's rule: its rule runs, on the device's
    array module, inside the context; a context naming None runs the definition's rule."""
    import tapescope.core as mx
    from conftest import registered_as_gpu

    entered = []

    class Context(backends.DeviceContext):
        __slots__ = ("name",)

        def __init__(self, name, rule):
            super().__init__(rule)
            self.name = name

        def __enter__(self):
            entered.append(self.name)

    def negated_exp(xp, x, **kw):  # a rule the definition does not have: it shows it ran
        return -xp.exp(x)

    class ContextGpu(backends.Backend):
        name, device_type, dialect = "contextgpu", "gpu", "c"

        def device_context(self, stream, node=None) -> Context:
            name = node.primitive.name
            return Context(name, negated_exp if name == "Exp" else None)

        def run_compiled(self, tape, inputs, shape, out=None, donatable=None):
            raise NotImplementedError

    x = np.linspace(-2, 2, 7, dtype=np.float32)
    cpu = mx.default_device()  # (asked first: a GPU registered now would become the default)
    gen = registered_as_gpu(ContextGpu(np))
    next(gen)
    try:
        with mx.stream(mx.gpu):
            a = mx.array(x)
            e, s = mx.exp(a), mx.sin(a)
            mx.eval(e, s)
    finally:
        gen.close()
    assert mx.default_device() == cpu
    np.testing.assert_allclose(np.array(e), -np.exp(x.astype(np.float64)), rtol=1e-6)
    np.testing.assert_allclose(np.array(s), np.sin(x.astype(np.float64)), rtol=1e-6)
    assert "Exp" in entered and "Sin" in entered


def test_quiet_follows_the_array_type():
    cpu = backends.registered()["cpu"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with cpu.quiet():  # numpy's floating-point warnings silenced, as MLX has none
            np.divide(np.ones(1), np.zeros(1))
    with pytest.raises(RuntimeWarning):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            np.divide(np.ones(1), np.zeros(1))

    class DeviceArrays(backends.Backend):  # arrays that are not numpy's: nothing to silence
        name, device_type, dialect, array_type = "devicearrays", "gpu", "c", object

        def run_compiled(self, tape, inputs, shape, out=None, donatable=None):
            raise NotImplementedError

    assert DeviceArrays(np, cpu.allocator).quiet is contextlib.nullcontext


def test_a_backend_missing_run_compiled_cannot_be_made():
    class Half(backends.Backend):
        name = "half"

    with pytest.raises(TypeError, match="run_compiled"):
        Half()


def test_a_backend_says_who_it_is():
    """The base is no device's (not the CPU's): a backend that declares no name, device
    type or dialect cannot be made."""
    assert backends.DECLARED == ("name", "device_type", "dialect")
    assert not any(hasattr(backends.Backend, f) for f in backends.DECLARED)

    class Anonymous(backends.Backend):
        device_type = "gpu"

        def run_compiled(self, tape, inputs, shape, out=None, donatable=None):
            raise NotImplementedError

    with pytest.raises(TypeError, match="declares no name, dialect"):
        Anonymous(np)
    for name in BACKENDS:
        node = _read(name)
        declared = {t.id for n in node.body if isinstance(n, ast.Assign)
                    for t in n.targets if isinstance(t, ast.Name)}
        assert set(backends.DECLARED) <= declared, name


def test_a_numpy_allocator_declines_to_import_or_export_device_memory():
    alloc = backends.registered()["cpu"].allocator
    with pytest.raises(TypeError, match=r"\[array\]"):
        alloc.import_host(None, None)
    with pytest.raises(TypeError, match=r"\[export\]"):
        alloc.export(None, None)


def test_the_allocator_says_which_allocation_an_array_lives_in():
    alloc = backends.registered()["cpu"].allocator
    a = np.arange(12.0)
    v = a.reshape(3, 4)[1:, ::2]
    strided = np.lib.stride_tricks.as_strided(a, (3,), (16,))
    assert alloc.memory_of(v) is alloc.memory_of(strided) is alloc.memory_of(a) is a
    assert alloc.owner(v) is a and alloc.owner(a) is a  # the array that owns it all
    raw = bytearray(8)
    assert alloc.owner(np.frombuffer(raw, np.uint8)) is None  # not ours to adopt: copied


def test_a_result_over_memory_no_array_owns_is_copied_in_its_layout():
    """(The copy is the array's own ``copy(order="K")``.) A rule's result
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
