"""tapescope's settings: one object (``tapescope.settings``) for every mode and switch.

Each setting has a name, a kind, a default and an environment variable. The variable gives
the initial value, parsed by one rule for its kind; a change to the variable while the
process runs is picked up the next time the setting is read, and an assignment in Python
(``tapescope.settings.tiered = True``) wins until the variable changes again. As a context
manager the object sets values for a block and puts the previous state back after it::

    with tapescope.settings(fusion="extended", tiered=True):
        ...

The parsing rule: an unset or empty variable means the default; a switch takes ``1``,
``true``, ``yes``, ``on`` or ``0``, ``false``, ``no``, ``off`` (any case), so
``TAPESCOPE_DISABLE_GPU=0`` leaves the GPU on; a choice takes one of its values (any case);
anything else is a ``ValueError`` that names the variable. The older functions
(``set_fusion``, ``set_tiered``, ...) are views of these settings.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Setting:
    """One setting: its environment variable, its kind (``"switch"``, ``"choice"``,
    ``"text"``), its default, its choices (a choice's) and what it does."""

    name: str
    env: str
    kind: str
    default: Any
    doc: str
    choices: tuple = ()

    def parse(self, raw: Optional[str], source: str) -> Any:
        """The value a string gives (``source`` names where it came from, for the error)."""
        text = "" if raw is None else raw.strip()
        if text == "":
            return self.default
        if self.kind == "text":
            return text
        low = text.lower()
        if self.kind == "switch":
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            expected = "1/0, true/false, yes/no or on/off"
        else:
            if low in self.choices:
                return low
            expected = "one of " + ", ".join(map(repr, self.choices))
        raise ValueError(f"[settings] {source}={raw!r}: expected {expected}.")

    def check(self, value: Any) -> Any:
        """A value assigned in Python, checked (and a choice's normalised)."""
        if self.kind == "switch":
            if not isinstance(value, (bool, int)):
                raise TypeError(f"[settings] {self.name} is a switch (True or False), "
                                f"not {type(value).__name__}.")
            return bool(value)
        if self.kind == "choice":
            if not isinstance(value, str) or value.lower() not in self.choices:
                raise ValueError(f"[settings] Unknown {self.name} {value!r}: expected one of "
                                 f"{', '.join(map(repr, self.choices))}.")
            return value.lower()
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"[settings] {self.name} is text (or None), not {type(value).__name__}.")
        return None if value is None else os.fspath(value)


SETTINGS = (
    Setting("fusion", "TAPESCOPE_FUSION", "choice", "mlx",
            "How mx.compile fuses: 'mlx' (MLX's rules, elementwise chains) or 'extended' "
            "(tapescope's extension: reductions fuse with their elementwise neighbours).",
            choices=("mlx", "extended")),
    Setting("tiered", "TAPESCOPE_TIERED", "switch", False,
            "Tiered first calls: a fused kernel that is not built yet runs interpreted while "
            "it builds in the background."),
    Setting("cache_dir", "TAPESCOPE_CACHE_DIR", "text", None,
            "The kernel cache's folder (None: the user cache folder, tapescope/kernels)."),
    Setting("cuda", "TAPESCOPE_CUDA", "switch", False,
            "Register the CUDA runtime (opt-in until its suite passes on a GPU)."),
    Setting("metal", "TAPESCOPE_METAL", "switch", False,
            "Register the Metal runtime on macOS (opt-in until run on Apple hardware)."),
    Setting("disable_gpu", "TAPESCOPE_DISABLE_GPU", "switch", False,
            "Hide every GPU backend: the CPU is the only device."),
    Setting("c_call", "TAPESCOPE_C_CALL", "switch", True,
            "Use core/_call.c (a compiled call, recording a node, the eval loop's hot part for "
            "every backend) where it is built; read when tapescope.core is imported."),
    Setting("tf32", "MLX_ENABLE_TF32", "switch", True,
            "MLX's variable: float32 matmuls and convolutions on CUDA in TensorFloat-32 "
            "(kernels/cuda/precision.py); 0 computes them in full float32."),
    Setting("sdpa_blocks", "MLX_SDPA_BLOCKS", "text", None,
            "MLX's variable: the key runs a row of decoding attention's two-pass kernels on "
            "CUDA (a positive integer; unset: the device's SMs pick them), read when a "
            "layout is planned (kernels/codegen/attention_cuda.py: splits)."),
    Setting("eager_kernels", "TAPESCOPE_EAGER_KERNELS", "switch", True,
            "Eager elementwise ops as one-op kernels of the renderer, launched from the eval "
            "loop (a GPU's: kernels/cuda/eager.py; the CPU's from 65536 elements on: "
            "kernels/cpu/eager.py); off: their array-module rules."),
    Setting("kernel_cflags", "TAPESCOPE_KERNEL_CFLAGS", "text", "",
            "Flags added to every C kernel build (make test-ub passes the sanitizers)."),
    Setting("metal_shim", "TAPESCOPE_METAL_SHIM", "switch", False,
            "Run mx.fast.metal_kernel through the Metal shim on the CPU where there is no "
            "Metal (a verification tool)."),
)

_BY_NAME = {s.name: s for s in SETTINGS}


def setting(name: str) -> Setting:
    """The definition of the setting ``name``."""
    return _BY_NAME[name]


class Settings:
    """tapescope's settings (see the module): read and assign them as attributes, list them
    with ``describe()``, or set some for a block with ``with settings(name=value, ...)``."""

    def __init__(self) -> None:
        object.__setattr__(self, "_lock", threading.RLock())
        # per setting: (raw environment string last seen, value)
        object.__setattr__(self, "_state", {})
        object.__setattr__(self, "_watchers", {})

    def _value(self, s: Setting) -> Any:
        raw = os.environ.get(s.env)
        state = self._state.get(s.name)
        if state is not None and state[0] == raw:
            return state[1]
        with self._lock:  # first read, or the variable changed: it gives the value
            value = s.parse(raw, s.env)
            self._state[s.name] = (raw, value)
        self._notify(s.name, value)
        return value

    def __getattr__(self, name: str) -> Any:  # only for names that are not settings
        raise AttributeError(f"[settings] No setting named {name!r}: the settings are "
                             f"{', '.join(_BY_NAME)}.")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _BY_NAME:
            self.__getattr__(name)
        object.__setattr__(self, name, value)  # the setting's property

    def _assign(self, s: Setting, value: Any) -> None:
        value = s.check(value)
        with self._lock:
            self._state[s.name] = (os.environ.get(s.env), value)
        self._notify(s.name, value)

    def _notify(self, name: str, value: Any) -> None:
        for fn in self._watchers.get(name, ()):
            fn(value)

    def watch(self, name: str, fn: Callable[[Any], None]) -> None:
        """Call ``fn(value)`` with the setting's value now and whenever it changes (for a
        reader that keeps a copy, e.g. a list the C call path reads)."""
        self._watchers.setdefault(_BY_NAME[name].name, []).append(fn)
        fn(self._value(_BY_NAME[name]))

    def __call__(self, **values: Any) -> "_Block":
        """A context manager setting ``values`` for a block (checked before any is set)."""
        for name, value in values.items():
            s = _BY_NAME.get(name)
            if s is None:
                raise AttributeError(f"[settings] No setting named {name!r}: the settings are "
                                     f"{', '.join(_BY_NAME)}.")
            s.check(value)
        return _Block(self, values)

    def describe(self) -> list[dict]:
        """Every setting: name, value, environment variable, default, what it does."""
        return [{"name": s.name, "value": self._value(s), "env": s.env, "default": s.default,
                 "doc": s.doc} for s in SETTINGS]

    def __iter__(self) -> Iterator[str]:
        return iter(_BY_NAME)

    def __repr__(self) -> str:
        return "Settings(" + ", ".join(f"{s.name}={self._value(s)!r}" for s in SETTINGS) + ")"


def _property(s: Setting) -> property:
    return property(lambda self: self._value(s), lambda self, v: self._assign(s, v), doc=s.doc)


for _s in SETTINGS:
    setattr(Settings, _s.name, _property(_s))
del _s


class _Block:
    """``with settings(...)``: the values set on entry, the previous state back on exit."""

    def __init__(self, owner: Settings, values: dict):
        self._owner, self._values, self._saved = owner, values, None

    def __enter__(self) -> Settings:
        o = self._owner
        self._saved = {n: (o._state.get(n), getattr(o, n)) for n in self._values}
        for name, value in self._values.items():
            setattr(o, name, value)
        return o

    def __exit__(self, *exc) -> bool:
        o = self._owner
        for name, (state, value) in self._saved.items():
            with o._lock:
                if state is None:
                    o._state.pop(name, None)
                else:
                    o._state[name] = state
            o._notify(name, value)
        return False


settings = Settings()
