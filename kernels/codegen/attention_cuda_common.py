"""What the CUDA attention kernels write alike: ``attention_cuda``'s decoding kernels,
``attention_flash``'s prefill and its ``attention_flash16`` tiles.

Their parameters are one list (``params``: what a launch packs, in order) that
``declarations`` writes as the kernel's C arguments; their scores are in base 2 (the query
scaled by ``scale * LOG2E``, ``exp2`` the exponential), a boolean mask's False is float32's
lowest (MLX's fallback's ``finfo.min``); and the two prefill kernels share a score element's
masking (``masked``) and the causal key range (``key_end``).
"""

from __future__ import annotations

LOG2E = 1.4426950408889634
LOWEST = "(-3.402823466e+38f)"  # float32's lowest, as a CUDA literal
STORE = {"float32": "{}", "float16": "__float2half_rn({})", "bfloat16": "__float2bfloat16_rn({})"}
# batch, query heads, key / value heads, query and key lengths, the q / k / v strides
# (batch, head, row); a mask's strides (batch, head, row, key)
PARAMS = ("B", "H", "Hk", "L", "kL", "qsb", "qsh", "qsl", "ksb", "ksh", "ksl", "vsb", "vsh",
          "vsl")
MASK_PARAMS = ("msb", "msh", "msl", "msk")
NAMES = {"q": "Q", "k": "K", "v": "V", "mask": "MASK", "sinks": "SINKS", "out": "O",
         "part": "PART"}  # a buffer parameter's name in the kernel's C


def params(spec, out: str = "out", ints: tuple = ()) -> list:
    """An attention kernel's parameters in order: (kind, name), kind ``in`` / ``out`` (a
    buffer), ``int`` (int64) or ``float`` (float32): the query, key and value, ``spec``'s
    mask and sinks where it has them, the output buffer ``out``, ``PARAMS``, ``ints``, the
    mask's strides, ``scale``."""
    ps = [("in", "q"), ("in", "k"), ("in", "v")]
    if spec.mask != "none":
        ps.append(("in", "mask"))
    if spec.sinks:
        ps.append(("in", "sinks"))
    ps.append(("out", out))
    ps += [("int", n) for n in PARAMS + tuple(ints) + (MASK_PARAMS if spec.mask != "none" else ())]
    return ps + [("float", "scale")]


def declarations(spec, T: str, ps: list) -> str:
    """``ps`` (``params``' list) as the kernel's C arguments: buffers of ``T`` (the mask's
    of bool for a boolean mask, ``part``'s of float), restrict pointers, inputs const."""
    def buffer(kind: str, name: str) -> str:
        t = {"mask": "bool" if spec.mask == "bool" else T, "part": "float"}.get(name, T)
        return f"{'const ' if kind == 'in' else ''}{t}* __restrict__ {NAMES[name]}"
    return ", ".join(buffer(k, n) if k in ("in", "out") else
                     f"{'long long' if k == 'int' else 'float'} {n}" for k, n in ps)


def masked(spec, load: str) -> str:
    """The statements that make a prefill's score ``x`` (row ``r``, key ``j``) the one its
    softmax sees: causal, the mask (``mk``'s row, ``msk`` its key stride; ``load`` reads an
    element as float)."""
    elem = []
    if spec.causal:
        elem.append("if (j > r + kL - L) x = LOWEST;")
    if spec.mask == "bool":
        elem.append("if (!mk[j * msk]) x = LOWEST;")
    elif spec.mask == "add":
        elem.append(f"x += {LOG2E!r}f * {load.format('mk[j * msk]')};")
    return " ".join(elem)


def key_end(spec) -> tuple:
    """A prefill CTA's keys: (the C that sets ``kend``, the keys it visits, for causal up
    to its last row's last visible key; the terms ORed into a key tile's ``edge``, which
    takes the tile per element: the key tail, the causal diagonal, any mask)."""
    kend = ("""  long long kend = kL;
  {  // causal: the tiles up to the CTA's last row's last visible key, unless a row sees none
    const long long last = (qb * BQ + BQ < L ? qb * BQ + BQ : L) - 1;
    if (qb * BQ + kL - L >= 0 && last + kL - L + 1 < kend) kend = last + kL - L + 1;
  }
""" if spec.causal else "  const long long kend = kL;\n")
    edge = " || (j0 + BK > kL)"  # the key tail
    if spec.causal:
        edge += " || (j0 + BK - 1 > qb * BQ + kL - L)"
    if spec.mask != "none":
        edge = " || true"
    return kend, edge
