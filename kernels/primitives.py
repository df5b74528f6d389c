"""One definition per primitive: everything tapescope knows about ``Exp``, ``Sum``, ... in one record.

A ``PrimitiveDef`` holds a primitive's name (as MLX prints it), its family, its array-module
rule (``fn(xp, *inputs, **params)``, numpy and cupy alike), whether that rule writes into
``out=`` / takes ``donatable=`` flags / returns views, its output shape and dtype rules (a
function where the family makes one generic, otherwise where the op computes them), its
spelling per kernel dialect (``"c"`` today), its transformation rules (vjp, jvp, vmap) and
its FLOP count (``flops``: per output element, or a function of the shapes; the roofline's),
the generated kernel a backend runs it as (``kernel``, with a reduction's or scan's
``monoid``), how MLX prints and exports it (``label``, ``export``) and the flags that the
layers above ask (``moves``, ``fill``, ``stops_gradient``, ``fused_alone``, a view's
``view_strides``).
A facet that a primitive lacks carries the reason in ``why`` ("no C spelling: a fusion
boundary"); ``tests/test_primitives.py`` lists every definition and fails on a facet that
is neither present nor explained.

Definitions are registered beside their rules, as JAX registers ``exp_p`` with its rules:
``@define("Exp", family=UNARY, out=True, c="exp")`` above the rule in
``kernels/rules/<family>.py``. Core looks a definition up once per recorded ``Primitive``.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

# -- families ------------------------------------------------------------------------------
UNARY = "unary"
BINARY = "binary"
TERNARY = "ternary"
BROADCAST = "broadcast"
ASTYPE = "astype"
MULTI_OUTPUT = "multi_output"
REDUCE = "reduce"
SCAN = "scan"
SHAPE = "shape"
INDEXING = "indexing"
SORT = "sort"
MATMUL = "matmul"
CREATION = "creation"
RANDOM = "random"
FFT = "fft"
LINALG = "linalg"
COMPILED = "compiled"
PLACEHOLDER = "placeholder"
DISTRIBUTED = "distributed"
QUANTIZED = "quantized"
FAST = "fast"  # MLX's fast primitives (RMSNorm, LayerNorm, RoPE and their VJPs)
IO = "io"
CUSTOM_FUNCTION = "custom"  # mx.custom_function / checkpoint: MLX's CustomTransforms

ELEMENTWISE = frozenset({UNARY, BINARY, TERNARY})
# What compile may fuse into a Compiled tape (shared/DESIGN.md).
FUSABLE = frozenset({UNARY, BINARY, TERNARY, BROADCAST, ASTYPE})

# Where the op layer computes output shapes and dtypes for families without a generic rule.
_WHERE = {
    MULTI_OUTPUT: "interactive/core/ops/binary.py (divmod)",
    REDUCE: "interactive/core/ops/reduction.py",
    SCAN: "interactive/core/ops/scan.py",
    SHAPE: "interactive/core/ops/shape.py (each op computes its output shape)",
    INDEXING: "interactive/core/ops/indexing.py, interactive/core/array_indexing.py",
    SORT: "interactive/core/ops/sort.py, interactive/core/ops/extras.py",
    MATMUL: "interactive/core/ops/products.py",
    CREATION: "interactive/core/ops/creation.py (the shape and dtype are the op's arguments)",
    RANDOM: "interactive/core/random.py",
    FFT: "interactive/core/fft.py",
    LINALG: "interactive/core/linalg.py",
    PLACEHOLDER: "interactive/core/compile_trace.py (the traced argument's shape and dtype)",
    DISTRIBUTED: "interactive/core/distributed.py (each collective computes its output)",
    QUANTIZED: "interactive/core/ops/quantized.py (each op computes its outputs, as mlx/ops.cpp)",
    IO: "interactive/core/serialize.py (the file's header gives the shape and dtype)",
}

# The stated reasons a facet may be absent.
NOT_FUSED = "not fusable ({}): runs as its own node, never inside a kernel tape"
VJP_LATER = "not written yet: its module in interactive/core/autodiff/ registers it (defvjp)"
JVP_LATER = "not written yet: its module in interactive/core/autodiff/ registers it (defjvp)"
VMAP_LATER = "not written yet: its module in interactive/core/vmap/ registers it (defvmap)"

DIALECTS = ("c",)

ShapeRule = Callable[..., list]  # (input shapes, **params) -> one shape per output
# (input shapes, output shapes) -> the FLOPs of one run
FlopsRule = Callable[[list, list], int]


def broadcast_shapes(*shapes: tuple) -> tuple:
    """numpy's broadcast of shapes (ValueError when they do not broadcast)."""
    if len(shapes) == 2:  # the common cases: two equal shapes, or one of them ()
        a, b = shapes
        if a == b or not b:
            return tuple(a)
        if not a:
            return tuple(b)
    nd = max((len(s) for s in shapes), default=0)
    out = [1] * nd
    for s in shapes:
        off = nd - len(s)
        for i, n in enumerate(s):
            m = out[i + off]
            if m == 1:
                out[i + off] = n
            elif n != 1 and n != m:
                raise ValueError(f"Shapes {' and '.join(str(tuple(x)) for x in shapes)} "
                                 "cannot be broadcast.")
    return tuple(out)


def _elementwise_shape(shapes: list, **_) -> list:
    return [broadcast_shapes(*shapes)]


def same_shape(shapes: list, **_) -> list:
    """One output of the first input's shape."""
    return [tuple(shapes[0])]


def _broadcast_shape(shapes: list, *, shape, **_) -> list:
    return [tuple(shape)]


_GENERIC_SHAPE = {UNARY: _elementwise_shape, BINARY: _elementwise_shape,
                  TERNARY: _elementwise_shape, ASTYPE: same_shape, BROADCAST: _broadcast_shape}
_GENERIC_DTYPE = {
    ASTYPE: "the ``dtype`` parameter",
    BROADCAST: "the input's dtype",
    UNARY: "interactive/core/ops/elementwise.py (unary(): the input's, or the op's out_dtype)",
    BINARY: "interactive/core/ops/elementwise.py (binary(): promoted, or the op's out_dtype)",
    TERNARY: "interactive/core/ops/ternary.py (where: the promoted branches)",
}


def _reduced_flops(in_shapes: list, out_shapes: list) -> int:
    """A reduction: one operation per input element (the sum's adds, the max's compares)."""
    return elements(in_shapes[0])


def elements(shape) -> int:
    """The number of elements of ``shape``."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


# FLOPs per output element by family (``PrimitiveDef.flops``): an elementwise op is one
# operation per element whatever it computes (tinygrad's count: one ALU op each; a
# transcendental's polynomial is not expanded, a complex op is not split into its real
# ones); a broadcast or a cast moves data and computes nothing; a reduction is one
# operation per input element. Families absent here are not counted (None).
_GENERIC_FLOPS = {UNARY: 1, BINARY: 1, TERNARY: 1, BROADCAST: 0, ASTYPE: 0, SHAPE: 0,
                  CREATION: 0, IO: 0, REDUCE: _reduced_flops}


class PrimitiveDef:
    """Everything about one primitive (see the module docstring); one per name, never copied."""

    __slots__ = ("name", "family", "rule", "takes_out", "takes_donatable", "takes_runtime", "view",
                 "fusable", "elementwise", "shape", "dtype", "spellings", "vjp", "jvp", "vmap",
                 "why", "flops", "kernel", "monoid", "label", "export", "moves", "fill",
                 "stops_gradient", "fused_alone", "view_strides", "power")

    def __init__(self, name: str, family: str, rule: Optional[Callable], *, out: bool = False,
                 donatable: bool = False, view: bool = False,
                 shape: Union[ShapeRule, str, None] = None, dtype: Union[Callable, str, None] = None,
                 spellings: Optional[dict] = None, vjp: Optional[Callable] = None,
                 jvp: Optional[Callable] = None, vmap: Optional[Callable] = None,
                 why: Optional[dict] = None, flops: Union[int, FlopsRule, None] = None,
                 kernel: Optional[str] = None, monoid: Optional[str] = None,
                 label: Optional[Callable] = None, export: Optional[Callable] = None,
                 moves: bool = False, fill: bool = False, stops_gradient: bool = False,
                 fused_alone: bool = False, view_strides: Optional[Callable] = None,
                 power: bool = False):
        self.name = name
        self.family = family
        self.rule = rule
        self.takes_out = out  # the rule writes into an ``out=`` array it is given
        self.takes_donatable = donatable  # the rule takes ``donatable=`` flags, one per input
        self.view = view  # the rule only makes views (nothing computed)
        # a fused tape's rule takes ``runtime=``: the device backend's compiled-kernel runtime
        self.takes_runtime = family == COMPILED
        self.fusable = family in FUSABLE
        self.elementwise = family in ELEMENTWISE  # bfloat16 math runs in float32
        self.shape = shape if shape is not None else _GENERIC_SHAPE.get(family, _WHERE.get(family))
        self.dtype = dtype if dtype is not None else _GENERIC_DTYPE.get(family, _WHERE.get(family))
        self.spellings = dict(spellings or {})  # dialect -> libm stem (str) or fn(d, args, o, i)
        self.vjp, self.jvp, self.vmap = vjp, jvp, vmap
        why = dict(why or {})
        if not self.fusable:
            for dialect in DIALECTS:
                why.setdefault(dialect, NOT_FUSED.format(family))
        why.setdefault("vjp", VJP_LATER)
        why.setdefault("jvp", JVP_LATER)
        why.setdefault("vmap", VMAP_LATER)
        self.why = why  # facet -> why it is absent
        # FLOPs: a number per output element, or ``fn(input shapes, output shapes)`` for a
        # whole run; None: not counted (the roofline places the op by its bytes only)
        self.flops = flops if flops is not None else _GENERIC_FLOPS.get(family)
        # the generated kernel that runs it where a backend has one (``common/reductions.py``,
        # ``common/norms.py``, the backends' kernel modules): ``"reduce"``, ``"arg_reduce"``,
        # ``"softmax"``, ``"logsumexp"``, ``"scan"``, ``"rms"``, ``"layer_norm"``,
        # ``"vjp_rms"``, ``"vjp_layer_norm"``, ``"rope"``, ``"quantized_matmul"``,
        # ``"gather_qmm"``, ``"random_bits"``, ``"erfinv"``; None: its array-module rule only
        self.kernel = kernel
        # what a reduction or a scan folds with: "sum", "prod", "max", "min", "and", "or",
        # "logaddexp" (MLX's Reduce::ReduceType / Scan::ReduceType)
        self.monoid = monoid
        # ``fn(params) -> str``: the name MLX prints where the parameters change it
        # ("SliceUpdate Sum"); None: ``name``
        self.label = label
        # ``fn(params) -> (class, state)``: the class MLX's export callback names it by and
        # its ``state()`` as a list (mlx/export.cpp); None: ``name`` and the parameters' values
        self.export = export
        # the rule only moves elements: its result's bits are its inputs' bits, whatever the
        # dtype (a runtime may run it on a half type's raw storage)
        self.moves = moves or view
        self.fill = fill  # it fills a new array with its broadcast input (MLX's Full)
        self.stops_gradient = stops_gradient  # no cotangent or tangent flows through it
        # extended fusion gives it a kernel of its own even alone (a lone Sum stays MLX's)
        self.fused_alone = fused_alone
        # a view's ``fn(input strides, input shape, output shape, **params) -> strides`` (in
        # elements), where they follow from the parameters alone (Broadcast, Transpose,
        # Slice): a view that never copies (the eval loop runs a device's in C)
        self.view_strides = view_strides
        # it raises its first input to its second (MLX's Power): a small constant integer
        # exponent may be multiplied out (codegen's interpreter and C renderer)
        self.power = power

    def count_flops(self, in_shapes: list, out_shapes: list) -> Optional[int]:
        """The FLOPs of one run with these input and output shapes (None: not counted)."""
        f = self.flops
        if f is None or callable(f):
            return None if f is None else int(f(list(in_shapes), list(out_shapes)))
        return f * sum(elements(s) for s in out_shapes)

    def facets(self) -> dict:
        """Facet name -> the facet (None when absent), for the registry test and the docs."""
        f = {"rule": self.rule, "shape": self.shape, "dtype": self.dtype,
             "vjp": self.vjp, "jvp": self.jvp, "vmap": self.vmap}
        for dialect in DIALECTS:
            f[dialect] = self.spellings.get(dialect)
        return f

    def __repr__(self) -> str:
        return f"PrimitiveDef({self.name}, {self.family})"


REGISTRY: dict[str, PrimitiveDef] = {}


def define(*names: str, family: str, out: bool = False, donatable: bool = False,
           view: bool = False, shape: Union[ShapeRule, str, None] = None,
           dtype: Union[Callable, str, None] = None, c: Union[str, Callable, None] = None,
           msl: Optional[Callable] = None, why: Optional[dict] = None, vjp: Optional[Callable] = None,
           jvp: Optional[Callable] = None, vmap: Optional[Callable] = None,
           flops: Union[int, FlopsRule, None] = None, **flags) -> Callable:
    """Decorator: define each primitive in ``names`` with the decorated function as its rule.

    ``c`` is the C spelling: a libm stem (``"exp"``: the dialect's float / double function)
    or ``fn(dialect, args, out_dtype, in_dtype) -> expression`` raising
    ``codegen.c_ops.Unsupported`` for dtypes it cannot express; ``msl``: the Metal dialect's
    spelling (such a function) where C's does not hold there. ``why`` maps an absent facet
    (``"c"``, ``"vjp"``, ...) to the reason it is absent. ``flops``: FLOPs per output element,
    or ``fn(input shapes, output shapes)``; the family's count by default (``_GENERIC_FLOPS``).
    ``flags``: ``kernel``, ``monoid``, ``label``, ``export``, ``moves``, ``fill``,
    ``stops_gradient``, ``fused_alone``, ``view_strides``, ``power`` (``PrimitiveDef``'s
    attributes of those names).
    """

    def deco(fn: Callable) -> Callable:
        for n in names:
            if n in REGISTRY:
                raise KeyError(f"primitive {n} defined twice")
            REGISTRY[n] = PrimitiveDef(n, family, fn, out=out, donatable=donatable, view=view,
                                       shape=shape, dtype=dtype,
                                       spellings={k: v for k, v in (("c", c), ("metal", msl))
                                                  if v is not None},
                                       vjp=vjp, jvp=jvp, vmap=vmap, why=why, flops=flops,
                                       **flags)
        return fn

    return deco


def lookup(name: str) -> PrimitiveDef:
    """The definition of primitive ``name`` (KeyError when there is none)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unregistered primitive {name}") from None


def set_facet(name: str, facet: str, rule) -> None:
    """Give primitive ``name`` its ``facet`` rule (``vjp``, ``jvp``, ``vmap``), registered from
    the layer that writes it (core's transformations); any stated absence is dropped."""
    d = lookup(name)
    setattr(d, facet, rule)
    d.why.pop(facet, None)


def state_absent(name: str, facet: str, why: str) -> None:
    """Record why primitive ``name`` has no ``facet`` rule (the registry test reads it)."""
    d = lookup(name)
    setattr(d, facet, None)
    d.why[facet] = why


def family_of(name: str, default: str = "other") -> str:
    d = REGISTRY.get(name)
    return d.family if d is not None else default


def by_kernel(rules: dict) -> dict:
    """Primitive name -> rule, for every definition whose ``kernel`` is a key of ``rules``
    (a backend's kernel rules, keyed by the kernels it has)."""
    return {n: rules[d.kernel] for n, d in REGISTRY.items() if d.kernel in rules}


def spellings(dialect: str) -> dict:
    """Primitive name -> spelling in ``dialect``, for every definition that has one."""
    return {n: d.spellings[dialect] for n, d in REGISTRY.items() if dialect in d.spellings}


from . import rules as _rules  # noqa: E402,F401 - every definition module registers itself
