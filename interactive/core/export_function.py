"""``mx.export_function`` / ``mx.import_function`` / ``mx.exporter``: a function traced to a file
(or to a callback) and called again from it, with MLX 0.32's Python API, matching rules and
errors (``python/src/export.cpp``, ``mlx/export.cpp``).

The file is tapescope's own format, **not byte-compatible with MLX's ``.mlxfn``**: neither
library reads the other's files. It holds, after a magic line and a JSON header's length,
the header (format version, ``shapeless``, the metadata string, and per trace: the keyword
names, the inputs' shapes and dtypes, the tape of primitives in topological order with their
parameters, device, input references and output shapes / dtypes, the output references) and
then the raw bytes of the constants (each stored once per file, however many traces use it).
Parameters are stored as tagged JSON (numbers, strings, tuples, numpy dtypes and scalars);
a primitive whose parameters are anything else (a custom function's callables, a
communicator) cannot be exported: MLX's "Unable to serialize
primitive" error. Nothing is unpickled: a file can only name registered primitives.

Differences from MLX besides the format: an imported function's constants are read with the
file (MLX records a lazy ``Load`` per constant). The callback form gives each primitive
under MLX's serialized name with MLX's state (core/export_state.py).

A trace is ``compile_trace.trace`` (placeholders, the graph copied out by the one graph walker,
``walk.topological``) and ``compile_trace.simplify`` (MLX's ``compile_simplify``: equal scalar
constants merged, common subexpressions removed), never fused; a call of the imported
function is ``compile_trace.replay`` on the arguments (with shapes inferred per primitive when
the file is shapeless, as ``compile(shapeless=True)`` replays).
"""

from __future__ import annotations

import json
import struct
import threading
from typing import Any, Callable, Optional

import numpy as np

from . import dtypes as _dt
from .array import array
from .device import BadArgs, Device, DeviceType, binding, default_stream
from .export_dot import _letters
from .export_state import mlx_state
from .ops.convert import _fmt_shape
from .primitive import Primitive
from .compile_trace import GOp, Program, Val, dynamic_tracing, replay, simplify, trace

__all__ = ["export_function", "import_function", "exporter", "FunctionExporter"]

_MAGIC = b"TAPESCOPE-FUNCTION\n"
_FORMAT = 1
_LEN = struct.Struct("<Q")

_EXPORT_SIG = ("export_function(file_or_callback: str | Callable, fun: Callable, *args, "
               "shapeless: bool = False, metadata: str | None = None, **kwargs) -> None")
_IMPORT_SIG = ("import_function(file: str, return_metadata: bool = False) -> Callable | "
               "tuple[Callable, str]")
_EXPORTER_SIG = ("exporter(file: str, fun: collections.abc.Callable, *, shapeless: bool = False, "
                 "metadata: str | None = None) -> mlx.core.FunctionExporter")


# -- MLX's argument rules ------------------------------------------------------------------------
def _array_seq(x: Any) -> Optional[list]:
    """``x`` as nanobind casts it to ``std::vector<array>`` (a list or tuple of arrays), or None."""
    if isinstance(x, (list, tuple)) and all(isinstance(a, array) for a in x):
        return list(x)
    return None


def _array_dict(x: Any) -> Optional[dict]:
    if isinstance(x, dict) and all(isinstance(k, str) and isinstance(v, array) for k, v in x.items()):
        return dict(x)
    return None


def _inputs(args: tuple, kwargs: dict, prefix: str) -> tuple[list, dict]:
    """MLX's ``validate_and_extract_inputs``: positional and keyword arrays, or one tuple
    and / or one dict of arrays."""
    err = ValueError(f"{prefix} Inputs can either be a variable number of positional and "
                     "keyword arrays or a single tuple and/or dictionary of arrays.")
    if not args:
        kw = _array_dict(kwargs)
        if kw is None:
            raise err
        return [], kw
    if isinstance(args[0], array):
        pos, kw = _array_seq(args), _array_dict(kwargs)
        if pos is None or kw is None:
            raise err
        return pos, kw
    if len(args) == 1:
        if kwargs:
            raise err
        pos = _array_seq(args[0])
        if pos is not None:
            return pos, {}
        kw = _array_dict(args[0])
        if kw is None:
            raise err
        return [], kw
    if len(args) == 2:
        pos, kw = _array_seq(args[0]), _array_dict(args[1])
        if kwargs or pos is None or kw is None:
            raise err
        return pos, kw
    raise err


def _fmt_input(a: Any) -> str:
    return f"{_fmt_shape(tuple(a[0]))} {a[1].name}"


# -- the table of traces (mlx/export.cpp FunctionTable) ------------------------------------------
class _Function:
    """One trace: keyword names, input (shape, dtype)s, and the program."""

    __slots__ = ("kwarg_keys", "inputs", "program")

    def __init__(self, kwarg_keys: list, inputs: list, program: Program):
        self.kwarg_keys, self.inputs, self.program = kwarg_keys, inputs, program


class _Table:
    """Traces grouped by their number of inputs, matched as MLX matches them (dtype and ndim,
    and shape unless shapeless; keyword names only need to be among the call's)."""

    def __init__(self, shapeless: bool):
        self.shapeless = shapeless
        self.groups: dict = {}  # n_inputs -> [_Function], in insertion order

    def _match(self, args: list, kwargs: dict, fun: _Function) -> bool:
        if any(k not in kwargs for k in fun.kwarg_keys):
            return False
        given = [(a.shape, a.dtype) for a in args] + [(kwargs[k].shape, kwargs[k].dtype)
                                                     for k in sorted(kwargs)]
        for (shape, dtype), (fshape, fdtype) in zip(given, fun.inputs):
            if dtype != fdtype or len(shape) != len(fshape):
                return False
            if not self.shapeless and tuple(shape) != tuple(fshape):
                return False
        return True

    def find(self, args: list, kwargs: dict) -> Optional[_Function]:
        for fun in self.groups.get(len(args) + len(kwargs), ()):
            if self._match(args, kwargs, fun):
                return fun
        return None

    def insert(self, fun: _Function) -> None:
        self.groups.setdefault(len(fun.inputs), []).append(fun)

    def describe(self) -> str:
        """MLX's ``print_functions`` (its std::unordered_map lists the newest input count
        first, as libstdc++ iterates small integer keys)."""
        lines, n = [], 1
        for group in reversed(list(self.groups.values())):
            for fun in group:
                npos = len(fun.inputs) - len(fun.kwarg_keys)
                lines.append(f" {n}. Function with {npos} positional inputs and "
                             f"{len(fun.kwarg_keys)} keyword inputs:\n")
                n += 1
                for j, inp in enumerate(fun.inputs):
                    who = f"{j + 1}: " if j < npos else f"\"{fun.kwarg_keys[j - npos]}\": "
                    lines.append(f"   {who}{_fmt_input(inp)}\n")
        return "".join(lines)


class _Exporting(threading.local):
    """``.on`` while export_function traces on this thread (MLX's in_export_tracing); a class
    default, so reading it raises nothing."""

    on = False


_exporting = _Exporting()


def in_export_tracing() -> bool:
    """Whether ``export_function`` is tracing on this thread: a ``metal_kernel`` call is
    recorded without Metal then (mlx/backend/common/metal_kernel.cpp)."""
    return _exporting.on


def _trace(fun: Callable, args: list, kwargs: dict, shapeless: bool) -> _Function:
    """Trace ``fun`` on placeholders shaped as ``args`` then the keyword arrays by sorted name."""
    keys = sorted(kwargs)
    flat = args + [kwargs[k] for k in keys]
    n_args = len(args)

    def run(tracers: list):
        outs = fun(*tracers[:n_args], **dict(zip(keys, tracers[n_args:])))
        if isinstance(outs, array):
            outs = [outs]
        else:
            outs = _array_seq(outs)
            if outs is None:
                raise ValueError("[export_function] Outputs can be either a single array, a "
                                 "tuple, or a list of arrays.")
        return outs, None

    from .ops.compile_api import _state as compile_state

    # MLX's compiled functions called on an export's tracers run the function itself
    # (mlx/compile.cpp: "If the inputs are tracers, trace the original graph"), so the file
    # holds their primitives, never a fused Compiled one: compile is off while tracing
    saved, _exporting.on = in_export_tracing(), True
    enabled, compile_state["enabled"] = compile_state["enabled"], False
    try:
        with dynamic_tracing(shapeless):
            program, _ = trace(run, [(a.shape, a.dtype) for a in flat])
    finally:
        _exporting.on = saved
        compile_state["enabled"] = enabled
    simplify(program)
    return _Function(keys, [(a.shape, a.dtype) for a in flat], program)


# -- parameters as tagged JSON -------------------------------------------------------------------
class _Unserializable(Exception):
    pass


def _enc(v: Any) -> Any:
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return {"f": repr(v)}  # exact, and inf / nan survive
    if isinstance(v, complex):
        return {"c": [repr(v.real), repr(v.imag)]}
    if isinstance(v, tuple):
        return {"t": [_enc(x) for x in v]}
    if isinstance(v, list):
        return {"l": [_enc(x) for x in v]}
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {"d": {k: _enc(x) for k, x in v.items()}}
    if isinstance(v, _dt.Dtype):
        return {"Dtype": v.name}
    if isinstance(v, np.dtype):
        return {"np.dtype": _dt.from_numpy(v).name}
    if isinstance(v, np.generic) and not isinstance(v, np.void):
        return {"np.scalar": [_dt.from_numpy(v.dtype).name, _enc(v.item())]}
    if isinstance(v, np.ndarray) and v.dtype.kind in "biufc":
        return {"np.array": [_dt.from_numpy(v.dtype).name, list(v.shape), _enc(v.tolist())]}
    raise _Unserializable


def _dec(v: Any) -> Any:
    if not isinstance(v, dict):
        return v
    (tag, x), = v.items()
    if tag == "f":
        return float(x)
    if tag == "c":
        return complex(float(x[0]), float(x[1]))
    if tag == "t":
        return tuple(_dec(e) for e in x)
    if tag == "l":
        return [_dec(e) for e in x]
    if tag == "d":
        return {k: _dec(e) for k, e in x.items()}
    if tag == "Dtype":
        return _dt._dtype_by_name(x)
    if tag == "np.dtype":
        return _dt._dtype_by_name(x).np
    if tag == "np.scalar":
        return _dt._dtype_by_name(x[0]).np.type(_dec(x[1]))
    if tag == "np.array":
        return np.array(_dec(x[2]), dtype=_dt._dtype_by_name(x[0]).np).reshape(x[1])
    raise ValueError(f"unknown parameter tag {tag!r}")


# -- writing -------------------------------------------------------------------------------------
def _host(desc) -> np.ndarray:
    from tapescope.kernels.backends import host_array

    return np.ascontiguousarray(host_array(desc.data))


class _Writer:
    """The traces of one file, its constants (stored once each), and the file rewritten whole
    after every trace (so it is complete after each, as MLX's rewritten header keeps it)."""

    def __init__(self, file: str, shapeless: bool, metadata: str):
        self.file, self.shapeless, self.metadata = file, shapeless, metadata
        self.functions: list = []
        self.const_index: dict = {}  # id(desc) -> index
        self.const_descs: list = []  # keeps the descs (and so their ids) alive
        try:
            open(file, "wb").close()
        except OSError:
            raise RuntimeError(f"[export_function] Failed to open {file}") from None
        self.write()

    def _ref(self, v: Val, where: dict) -> list:
        if v.arg is not None:
            return ["arg", v.arg]
        if v.op is None:
            i = self.const_index.get(id(v.desc))
            if i is None:
                i = self.const_index[id(v.desc)] = len(self.const_descs)
                self.const_descs.append(v.desc)
            return ["const", i]
        return ["op", where[id(v.op)], v.index]

    def add(self, fun: _Function) -> None:
        prog = fun.program
        where: dict = {}
        tape = []
        for k, g in enumerate(prog.tape):
            try:
                params = _enc(dict(g.prim.kw))["d"]
            except _Unserializable:
                raise ValueError(f"[export_function] Unable to serialize primitive {g.prim.name}") from None
            tape.append({"primitive": g.prim.name, "device": g.prim.stream.device.type.name,
                         "params": params, "inputs": [self._ref(v, where) for v in g.inputs],
                         "outputs": [[list(o.shape), o.dtype.name] for o in g.outputs]})
            where[id(g)] = k
        self.functions.append({
            "kwarg_keys": fun.kwarg_keys,
            "inputs": [[list(s), d.name] for s, d in fun.inputs],
            "tape": tape,
            "outputs": [self._ref(v, where) for v in prog.outputs],
        })
        self.write()

    def write(self) -> None:
        blobs, consts, offset = [], [], 0
        for d in self.const_descs:
            data = _host(d)
            consts.append({"shape": list(d.shape), "dtype": d.dtype.name, "offset": offset,
                           "nbytes": data.nbytes})
            blobs.append(data.tobytes())
            offset += data.nbytes
        header = json.dumps({"format": _FORMAT, "tapescope": _package_version(),
                             "shapeless": self.shapeless, "metadata": self.metadata,
                             "constants": consts, "functions": self.functions}).encode()
        with open(self.file, "wb") as f:
            f.write(_MAGIC + _LEN.pack(len(header)) + header)
            for b in blobs:
                f.write(b)


# -- the callback form ---------------------------------------------------------------------------
def _to_callback(callback: Callable, fun: _Function, seen_constants: dict) -> None:
    """MLX's ``export_with_callback``: the inputs, keyword inputs, outputs, new constants, then
    each primitive with its named inputs and outputs (NodeNamer's A, B, ...), under MLX's
    serialized name with MLX's state as ``arguments`` (core/export_state.py)."""
    names: dict = {}

    def name(v: Any) -> str:
        n = names.get(id(v))
        if n is None:
            n = names[id(v)] = _letters(len(names) + 1)
        return n

    def data(vals: list) -> list:
        return [(name(v), tuple(v.shape), v.dtype) for v in vals]

    prog = fun.program
    callback({"type": "inputs", "inputs": data(prog.inputs)})
    n_pos = len(prog.inputs) - len(fun.kwarg_keys)
    callback({"type": "keyword_inputs",
              "keywords": [(k, name(v)) for k, v in zip(fun.kwarg_keys, prog.inputs[n_pos:])]})
    callback({"type": "outputs", "outputs": data(prog.outputs)})
    new = []
    for g in prog.tape:
        for v in g.inputs:
            if v.op is None and v.arg is None and id(v.desc) not in seen_constants:
                seen_constants[id(v.desc)] = v.desc
                new.append((name(v), array._wrap(v.desc)))
    callback({"type": "constants", "constants": new})
    for g in prog.tape:
        prim_name, arguments = mlx_state(g.prim)
        callback({"type": "primitive", "inputs": data(g.inputs), "outputs": data(g.outputs),
                  "name": prim_name, "arguments": arguments})


# -- the exporter --------------------------------------------------------------------------------
class FunctionExporter:
    """A context managing class for exporting multiple traces of the same function to a file.

    Make an instance of this class by calling :func:`mx.exporter`.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError("mlx.core.FunctionExporter: no constructor defined!")

    @classmethod
    def _make(cls, target: Any, fun: Callable, shapeless: bool, metadata: str) -> "FunctionExporter":
        self = object.__new__(cls)
        self._fun, self._closed = fun, False
        self._table = _Table(shapeless)
        self._callback: Optional[Callable] = None
        self._writer: Optional[_Writer] = None
        self._constants: dict = {}
        if isinstance(target, str):
            self._writer = _Writer(target, shapeless, metadata)
        else:
            self._callback = target
        return self

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> "FunctionExporter":
        return self

    def __exit__(self, exc_type: Any = None, exc_value: Any = None, traceback: Any = None) -> None:
        self.close()

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        args, kwargs = _inputs(args, kwargs, "[export_function]")
        self._export(args, kwargs)

    def _export(self, args: list, kwargs: dict) -> None:
        if self._closed:
            raise RuntimeError("[export_function] Attempting to write after exporting is closed.")
        if self._table.find(args, kwargs) is not None:
            raise RuntimeError("[export_function] Attempting to export a function twice with the "
                               "same signature is not allowed.")
        fun = _trace(self._fun, args, kwargs, self._table.shapeless)
        self._table.insert(fun)
        if self._callback is not None:
            _to_callback(self._callback, fun, self._constants)
        else:
            self._writer.add(fun)


def _bool(v: Any) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise BadArgs("flag")
    return bool(v)


def _metadata(v: Any) -> Optional[str]:
    if v is not None and not isinstance(v, str):
        raise BadArgs("metadata")
    return v


@binding(_EXPORTER_SIG)
def exporter(file: str, fun: Callable, *, shapeless: bool = False,
             metadata: Optional[str] = None) -> FunctionExporter:
    """Make a callable object that exports a trace of ``fun`` to ``file`` per call (one per
    new signature); ``with mx.exporter(file, fun) as e: e(x); e(x, y)``. The file is
    tapescope's format, not MLX's ``.mlxfn`` (see this module)."""
    if not isinstance(file, str) or not callable(fun):
        raise BadArgs("file")
    shapeless, metadata = _bool(shapeless), _metadata(metadata)
    return FunctionExporter._make(file, fun, shapeless, metadata or "")


@binding(_EXPORT_SIG)
def export_function(file_or_callback: Any, fun: Callable, *args: Any, shapeless: bool = False,
                    metadata: Optional[str] = None, **kwargs: Any) -> None:
    """Export ``fun`` traced on the example arrays (``*args`` and ``**kwargs``, or one tuple
    and / or one dict of arrays) to a file, or to a callback given each part of the graph.
    The file is tapescope's format, not byte-compatible with MLX's ``.mlxfn``: read it back
    with ``import_function``."""
    if not callable(fun):
        raise BadArgs("fun")
    shapeless, metadata = _bool(shapeless), _metadata(metadata)
    args, kwargs = _inputs(args, kwargs, "[export_function]")
    if not isinstance(file_or_callback, str):
        if not callable(file_or_callback):
            raise RuntimeError("std::bad_cast")
        if metadata:
            raise ValueError("[export_function] The metadata argument is only supported when "
                             "exporting to a file, not when using a callback.")
    FunctionExporter._make(file_or_callback, fun, shapeless, metadata or "")._export(args, kwargs)


# -- importing -----------------------------------------------------------------------------------
def _read(file: str) -> tuple[dict, bytes]:
    try:
        with open(file, "rb") as f:
            raw = f.read()
    except OSError:
        raise RuntimeError(f"[import_function] Failed to open {file}") from None
    if not raw.startswith(_MAGIC) or len(raw) < len(_MAGIC) + _LEN.size:
        raise RuntimeError(f"[import_function] {file} is not a tapescope function file "
                           "(tapescope's export format is not MLX's .mlxfn).")
    (n,) = _LEN.unpack_from(raw, len(_MAGIC))
    start = len(_MAGIC) + _LEN.size
    header = json.loads(raw[start:start + n].decode())
    if header.get("format") != _FORMAT:
        raise RuntimeError(f"[import_function] {file} has format {header.get('format')}; this "
                           f"tapescope reads format {_FORMAT}.")
    return header, raw[start + n:]


def _stream(device: str):
    return default_stream(Device(getattr(DeviceType, device)))


def _program(spec: dict, consts: list) -> _Function:
    """A trace read back as a Program of Vals and GOps on real Primitives."""
    inputs = [Val(tuple(s), _dt._dtype_by_name(d), arg=i) for i, (s, d) in enumerate(spec["inputs"])]
    tape: list = []

    def val(ref: list) -> Val:
        kind = ref[0]
        if kind == "arg":
            return inputs[ref[1]]
        if kind == "const":
            return consts[ref[1]]
        return tape[ref[1]].outputs[ref[2]]

    for op in spec["tape"]:
        prim = Primitive(op["primitive"], _stream(op["device"]), **_dec({"d": op["params"]}))
        g = GOp(prim, [val(r) for r in op["inputs"]])
        g.outputs = [Val(tuple(s), _dt._dtype_by_name(d), op=g, index=i)
                     for i, (s, d) in enumerate(op["outputs"])]
        tape.append(g)
    program = Program(inputs, [val(r) for r in spec["outputs"]], tape)
    return _Function(list(spec["kwarg_keys"]), [(v.shape, v.dtype) for v in inputs], program)


class _Imported:
    """The imported function: finds the trace the arguments match and replays it."""

    def __init__(self, table: _Table):
        self._table = table

    def __call__(self, *args: Any, **kwargs: Any) -> tuple:
        args, kwargs = _inputs(args, kwargs, "[import_function::call]")
        fun = self._table.find(args, kwargs)
        if fun is None:
            called = "".join(f"  {i + 1}: {_fmt_input((a.shape, a.dtype))}\n" for i, a in enumerate(args))
            called += "".join(f"  \"{k}\": {_fmt_input((v.shape, v.dtype))}\n" for k, v in kwargs.items())
            raise ValueError("[import_function::call] No imported function found which matches "
                             "the given positional and keyword arguments. Possible functions "
                             f"include:\n{self._table.describe()}\nCalled with {len(args)} "
                             f"positional inputs and {len(kwargs)} keyword inputs:\n{called}")
        real = [a._d for a in args] + [kwargs[k]._d for k in sorted(kwargs)]
        outs = replay(fun.program, real, self._table.shapeless)
        return tuple(array._wrap(d) for d in outs)


@binding(_IMPORT_SIG)
def import_function(file: str, return_metadata: bool = False) -> Any:
    """Import a function exported by ``export_function`` / ``exporter`` (tapescope's format);
    calling it returns a tuple of arrays. With ``return_metadata``: (function, metadata)."""
    if not isinstance(file, str):
        raise BadArgs("file")
    return_metadata = _bool(return_metadata)
    header, blob = _read(file)
    consts = []
    for c in header["constants"]:
        dtype = _dt._dtype_by_name(c["dtype"])
        data = np.frombuffer(blob, dtype.np, count=int(np.prod(c["shape"], dtype=np.int64)),
                             offset=c["offset"]).reshape(c["shape"]).copy()
        consts.append(Val(tuple(c["shape"]), dtype, desc=array(data, dtype)._d))
    table = _Table(bool(header["shapeless"]))
    for spec in header["functions"]:
        table.insert(_program(spec, consts))
    fn = _Imported(table)
    return (fn, header["metadata"]) if return_metadata else fn


def _package_version() -> str:
    """The installed tapescope's version (the package's metadata: core reads nothing of the
    layers above it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tapescope")
    except PackageNotFoundError:
        return "0+unknown"
