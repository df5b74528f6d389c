"""``einsum`` and ``einsum_path`` as MLX computes them: NumPy/opt_einsum-style subscript
parsing (``...`` ellipsis, implicit output), MLX's greedy contraction path, repeated
indices collapsed with a ``Gather``, single-operand indices summed, pairwise contractions
as a batched ``Matmul`` and everything else as broadcast ``Multiply`` + ``Sum``.

The work is split in three: ``_path`` validates the operands and picks the path (shared by
both functions), ``_plan`` derives every step's subscripts and checks the dtypes the
``Matmul`` steps will see (so a bad call raises before any node is recorded), and
``_build`` records the graph from the plan.
"""

from __future__ import annotations

import string
from typing import Any, NamedTuple, Optional

from .. import dtypes as _dt
from ..array import array
from ..device import StreamOrDevice, incompatible, resolve_stream
from .convert import _fmt_shape
from .reduction import _sum_dtype

__all__ = ["einsum", "einsum_path"]

_LETTERS = frozenset(string.ascii_letters)
_EINSUM_SIG = "einsum(subscripts: str, *operands, stream: StreamOrDevice = None) -> array"
_PATH_SIG = "einsum_path(subscripts: str, *operands)"


class _Node(NamedTuple):
    """One step of a path: its input subscripts, output subscript and operand positions."""

    inputs: list
    output: str
    positions: tuple


class _Info(NamedTuple):
    naive_cost: int
    naive_scaling: int
    optimized_cost: int
    optimized_scaling: int


# --------------------------------------------------------------------------- letter order

_FAST_BKT = (2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13)
_PRIMES = (13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97,
           103, 109, 113, 127, 137, 139, 149, 157, 167, 179, 193, 199, 211, 227, 241, 257)


class _Letters:
    """A set of letters iterating in the order MLX's ``std::unordered_set<char>`` does on
    Linux (libstdc++: identity hash, prime bucket counts, a node joins the front of its
    bucket or of the list). MLX's intermediate axis orders follow this order, so matching
    it makes the recorded graph (Transposes, Broadcasts) the one MLX records."""

    __slots__ = ("items", "buckets", "next_resize")

    def __init__(self, letters: Any = None) -> None:
        self.items: list = []
        self.buckets, self.next_resize = 1, 0
        for c in letters or ():  # the range constructor inserts one by one
            self.add(c)

    def _next_bkt(self, n: int) -> int:
        if n < len(_FAST_BKT):
            if n == 0:
                return 1
            self.next_resize = _FAST_BKT[n]
            return _FAST_BKT[n]
        p = next((p for p in _PRIMES if p >= n), n)
        self.next_resize = p
        return p

    def _place(self, c: str) -> None:
        b = ord(c) % self.buckets
        for i, x in enumerate(self.items):
            if ord(x) % self.buckets == b:
                self.items.insert(i, c)
                return
        self.items.insert(0, c)

    def add(self, c: str) -> None:
        if c in self.items:
            return
        n = len(self.items) + 1
        if n > self.next_resize:
            least = max(n, 0 if self.next_resize else 11)
            if least >= self.buckets:
                self.buckets = self._next_bkt(max(least + 1, self.buckets * 2))
                old, self.items = self.items, []
                for x in old:
                    self._place(x)
            else:
                self.next_resize = self.buckets
        self._place(c)

    def __iter__(self):
        return iter(self.items)

    def __contains__(self, c: str) -> bool:
        return c in self.items

    def __len__(self) -> int:
        return len(self.items)


# --------------------------------------------------------------------------- parsing

def _parse(subscripts: str) -> tuple[list, str]:
    """Split ``"ij,jk->ik"`` into inputs and output; infer the output in implicit mode."""
    subscripts = subscripts.replace(" ", "")
    pos = subscripts.find("->")
    if pos >= 0:
        lhs, rhs = subscripts[:pos], subscripts[pos + 2:]
    else:
        # implicit: the ellipsis first, then every index seen exactly once, sorted (MLX's
        # quirk kept: only the first '.' adds the ellipsis, later dots are counted)
        lhs, rhs, counts = subscripts, "", {}
        for c in subscripts:
            if c == ",":
                continue
            if c == "." and not rhs:
                rhs = "..."
                continue
            counts[c] = counts.get(c, 0) + 1
        rhs = "".join(sorted(rhs + "".join(c for c, n in counts.items() if n == 1)))
    return lhs.split(","), rhs


def _expand(fname: str, sub: str, operand: Optional[array], idx: int, remaining: str,
            max_len: list) -> str:
    """Check a subscript's letters and replace its ellipsis by unused letters."""
    have_ellipsis, before, after, i = False, 0, 0, 0
    while i < len(sub):
        c = sub[i]
        if c not in _LETTERS:
            if i + 2 >= len(sub) or sub[i:i + 3] != "...":
                raise ValueError(f"[{fname}] Subscripts must be letters, but got '{c}'.")
            if have_ellipsis:
                raise ValueError(f"[{fname}] Only one ellipsis per subscript is allowed but "
                                 f"found more in '{sub}'.")
            have_ellipsis = True
            i += 3
            continue
        if have_ellipsis:
            after += 1
        else:
            before += 1
        i += 1
    if not have_ellipsis:
        return sub
    if operand is not None:
        length = operand.ndim - before - after
        if length < 0:
            raise ValueError(
                f"[{fname}] Operand {idx} with shape {_fmt_shape(operand.shape)} has "
                f"insufficient dimensions for subscript '{sub}'. The ellipsis requires at "
                f"least {before + after} dimensions but the operand has {operand.ndim} "
                "dimensions.")
        max_len[0] = max(max_len[0], length)
    else:
        length = max_len[0]
    fill = remaining[len(remaining) - length:] if length else ""
    return sub[:before] + fill + sub[before + 3:]


def _term_size(term: Any, dims: dict) -> int:
    size = 1
    for c in term:
        size *= dims.get(c, 0)
    return size


def _flops(term: set, inner: bool, num_terms: int, dims: dict) -> int:
    factor = max(1, num_terms - 1) + (1 if inner else 0)
    return _term_size(term, dims) * factor


def _cost_and_scaling(inputs: list, output: str, dims: dict) -> tuple[int, int]:
    chars = set().union(*[set(s) for s in inputs])
    inner = any(c not in output for c in chars)
    return _flops(chars, inner, len(inputs), dims), len(chars)


# --------------------------------------------------------------------------- the path

def _greedy(inputs: list, output: str, dims: dict, cost_limit: int,
            memory_limit: int) -> tuple[list, int, int]:
    """MLX's greedy pairwise path (opt_einsum's, with MLX's cost and tie rules)."""
    sets = [_Letters(s) for s in inputs]
    inputs = list(inputs)
    out_set = _Letters(output)
    pairs = [(i, j) for i in range(len(inputs)) for j in range(i + 1, len(inputs))]
    path, candidates, path_cost, path_scaling = [], [], 0, 0

    def add(p1: int, p2: int) -> None:
        both = set(inputs[p1]) | set(inputs[p2])
        new = _Letters()
        for k, letters in enumerate(sets):
            if k not in (p1, p2):
                for c in letters:
                    if c in both:
                        new.add(c)
        for c in out_set:
            if c in both:
                new.add(c)
        new_size = _term_size(new, dims)
        if new_size > memory_limit:
            return
        removed = (_term_size(set(inputs[p1]), dims) + _term_size(set(inputs[p2]), dims)
                   - new_size)
        cost = _flops(both, len(both) > len(new), 2, dims)
        if path_cost + cost > cost_limit:
            return
        candidates.append((removed, cost, new, len(both), p1, p2))

    for _ in range(len(inputs) - 1):
        for p1, p2 in pairs:
            if set(inputs[p1]) & set(inputs[p2]):  # outer products only as a last resort
                add(p1, p2)
        if not candidates:
            for p1, p2 in pairs:
                add(p1, p2)
        if not candidates:  # nothing fits: the rest in one naive step
            cost, scale = _cost_and_scaling(inputs, output, dims)
            path.append(_Node(inputs, output, tuple(range(len(inputs)))))
            path_cost += cost
            path_scaling = max(path_scaling, scale)
            break
        best = candidates[0]
        for c in candidates[1:]:
            if c[0] > best[0] or (c[0] == best[0] and c[1] < best[1]):
                best = c
        removed, cost, new, ndims, x, y = best
        path_scaling = max(path_scaling, ndims)
        # MLX sorts the new term's letters by dimension size (a stable sort for short terms)
        new_str = "".join(sorted(new, key=lambda c: dims[c]))
        path.append(_Node([inputs[x], inputs[y]], new_str, (x, y)))
        del inputs[y], inputs[x], sets[y], sets[x]
        inputs.append(new_str)
        sets.append(new)
        kept = []
        for c in candidates:
            if c[4] in (x, y) or c[5] in (x, y):
                continue
            cx = c[4] - (c[4] > x) - (c[4] > y)
            cy = c[5] - (c[5] > x) - (c[5] > y)
            kept.append(c[:4] + (cx, cy))
        pairs = [(i, len(inputs) - 1) for i in range(len(inputs) - 1)]
        path_cost += cost
        candidates[:] = kept
    return path, path_cost, path_scaling


def _path(fname: str, subscripts: str, operands: tuple) -> tuple[list, _Info]:
    """Validate ``operands`` against ``subscripts`` and choose the contraction path."""
    if not operands:
        raise ValueError(f"[{fname}] At least one operand is required.")
    ins, out = _parse(subscripts)
    if len(operands) != len(ins):
        raise ValueError(f"[{fname}] Number of operands, {len(operands)}, does not match "
                         f"number of input subscripts, {len(ins)}")
    used = set(subscripts)
    remaining = "".join(c for c in string.ascii_lowercase + string.ascii_uppercase
                        if c not in used)
    max_len = [0]
    ins = [_expand(fname, s, operands[i], i, remaining, max_len) for i, s in enumerate(ins)]
    out = _expand(fname, out, None, -1, remaining, max_len)
    if len(set(out)) != len(out):
        raise ValueError(f"[{fname}] Repeat indices not allowed in output.")
    dims: dict = {}
    for i, s in enumerate(ins):
        shape = operands[i].shape
        if len(s) != len(shape):
            raise ValueError(f"[{fname}] Invalid number of subscripts {len(s)} for input {i} "
                             f"with {len(shape)} dimensions.")
        if len(set(s)) < len(s):
            local: dict = {}
            for c, d in zip(s, shape):
                if local.setdefault(c, d) != d:
                    raise ValueError(f"[{fname}] Dimensions of repeated subscripts do not "
                                     f"have the same size ({local[c]} != {d}).")
        for j, (c, d) in enumerate(zip(s, shape)):
            have = dims.setdefault(c, d)
            if d != 1 and have != 1 and have != d:
                raise ValueError(f"[{fname}] Cannot broadcast dimension {j} of input {i} with "
                                 f"shape {_fmt_shape(shape)} to size {have}.")
            dims[c] = max(have, d)
    max_size = max([_term_size(out, dims)] + [_term_size(s, dims) for s in ins])
    naive_cost, naive_scaling = _cost_and_scaling(ins, out, dims)
    if len(ins) <= 2:
        return ([_Node(ins, out, tuple(range(len(ins))))],
                _Info(naive_cost, naive_scaling, naive_cost, naive_scaling))
    path, cost, scaling = _greedy(ins, out, dims, naive_cost, max_size)
    last = path[-1]
    path[-1] = _Node(last.inputs, out, last.positions)
    return path, _Info(naive_cost, naive_scaling, cost, scaling)


# --------------------------------------------------------------------------- the plan

class _Prep(NamedTuple):
    """How one step's input is prepared: its repeats collapsed, then lone indices summed."""

    sub: str  # the subscript as the step receives it
    repeats: list  # [(letter, count)] collapsed by a Gather, in order
    collapsed: str  # the subscript after the Gather
    sum_axes: list  # axes of ``collapsed`` summed away
    final: str  # the subscript the contraction sees


def _prepare(node: _Node) -> list:
    """MLX's preprocessing of a step's inputs: collapse repeats, sum indices seen once."""
    collapsed = []
    for s in node.inputs:
        counts: dict = {}
        for c in s:
            counts[c] = counts.get(c, 0) + 1
        order = _Letters(s)  # MLX counts into a hash map and walks it in its order
        reps = [(c, counts[c]) for c in order if counts[c] > 1]
        col = "".join(c for c, _ in reps) + "".join(c for c in s if counts[c] == 1)
        collapsed.append((s, reps, col))
    seen: dict = {}
    for s in [col for _, _, col in collapsed] + [node.output]:
        for c in set(s):
            seen[c] = seen.get(c, 0) + 1
    preps = []
    for s, reps, col in collapsed:
        axes = [i for i, c in enumerate(col) if seen[c] == 1]
        final = "".join(c for i, c in enumerate(col) if i not in axes)
        preps.append(_Prep(s, reps, col, axes, final))
    return preps


def _can_dot(finals: list, output: str) -> bool:
    return len(finals) == 2 and any(c not in output for c in finals[0])


def _check_plan(path: list, operands: tuple) -> list:
    """Every step's preparation; raises MLX's late errors (from ``Matmul`` on non-float
    contractions, from ``Transpose`` on output letters no input has) before any node."""
    dtypes = [a.dtype for a in operands]
    plans = []
    for node in path:
        preps = _prepare(node)
        step = []
        for p, pos in zip(preps, node.positions):
            d = dtypes[pos]
            step.append(_sum_dtype(d) if p.sum_axes else d)
        finals = [p.final for p in preps]
        if _can_dot(finals, node.output):
            res = _dt.promote_types(step[0], step[1])
            if not _dt.is_inexact(res):
                raise ValueError(f"[matmul] Only inexact types are supported but "
                                 f"{step[0].name} and {step[1].name} were provided which "
                                 f"results in {res.name}, which is not a floating point type.")
        else:
            res = step[0]
            for d in step[1:]:
                res = _dt.promote_types(res, d)
            if any(c not in node.output for c in "".join(finals)):
                res = _sum_dtype(res)
        chars = set("".join(finals))
        missing = [c for c in node.output if c not in chars]
        if missing:
            kept = len(node.output) - len(missing)
            raise ValueError(f"[transpose] Received {len(node.output)} axes for array with "
                             f"{kept} dimensions.")
        for pos in reversed(node.positions):
            del dtypes[pos]
        dtypes.append(res)
        plans.append(preps)
    return plans


# --------------------------------------------------------------------------- the graph

def _collapse(x: array, p: _Prep, s) -> array:
    """Take the diagonal over each repeated letter with one ``Gather`` (MLX's way)."""
    from . import arange, reshape, squeeze
    from .indexing import _gather

    slice_sizes, axes, indices = list(x.shape), [], []
    n_expand = len(p.repeats)
    for c, v in p.repeats:
        for i, ch in enumerate(p.sub):
            if ch == c:
                slice_sizes[i] = 1
                axes.append(i)
        d = x.shape[axes[-1]]
        idx = reshape(arange(d, stream=s), [d] + [1] * (n_expand - 1), stream=s)
        n_expand -= 1
        indices += [idx] * v
    x = _gather(x, indices, axes, slice_sizes, s)
    return squeeze(x, [ax + len(p.repeats) for ax in axes], stream=s)


def _batch_tensordot(a: array, b: array, a_contract: list, a_batch: list, a_concat: list,
                     b_contract: list, b_batch: list, b_concat: list, s) -> array:
    """Contract ``a`` with ``b`` as one batched ``Matmul``, broadcasting shared axes."""
    from . import broadcast_to, matmul, reshape, transpose

    a_shape, b_shape = list(a.shape), list(b.shape)
    for ia, ib in list(zip(a_contract, b_contract)) + list(zip(a_batch, b_batch)):
        a_shape[ia] = b_shape[ib] = max(a.shape[ia], b.shape[ib])
    a = broadcast_to(a, a_shape, stream=s)
    b = broadcast_to(b, b_shape, stream=s)

    def transpose_reshape(x: array, i: list, j: list, k: list) -> array:
        size1 = size2 = 1
        for ax in j:
            size1 *= x.shape[ax]
        for ax in k:
            size2 *= x.shape[ax]
        shape = [x.shape[ax] for ax in i] + [size1, size2]
        return reshape(transpose(x, i + j + k, stream=s), shape, stream=s)

    out_shape = ([a.shape[ax] for ax in a_batch] + [a.shape[ax] for ax in a_concat]
                 + [b.shape[ax] for ax in b_concat])
    a = transpose_reshape(a, a_batch, a_concat, a_contract)
    b = transpose_reshape(b, b_batch, b_contract, b_concat)
    return reshape(matmul(a, b, stream=s), out_shape, stream=s)


def _dot(a: array, b: array, sa: str, sb: str, out: str, s) -> array:
    """A two-operand step with a contraction: split axes into contract/batch/concat."""
    from . import transpose

    a_contract = [i for i, c in enumerate(sa) if c not in out]
    a_batch = [i for i, c in enumerate(sa) if c in out and c in sb]
    a_concat = [i for i, c in enumerate(sa) if c in out and c not in sb]
    b_contract = [sb.find(sa[i]) for i in a_contract]
    b_batch = [sb.find(sa[i]) for i in a_batch]
    b_concat = [i for i, c in enumerate(sb) if c in out and c not in sa]
    letters = [sa[i] for i in a_batch + a_concat] + [sb[i] for i in b_concat]
    r = _batch_tensordot(a, b, a_contract, a_batch, a_concat, b_contract, b_batch, b_concat, s)
    return transpose(r, [letters.index(c) for c in out], stream=s)


def _naive(xs: list, subs: list, out: str, s) -> array:
    """Any other step: align every operand to one axis order, multiply, sum, transpose."""
    from . import multiply, reshape, sum as _sum, transpose

    axis: dict = {}
    for sub in subs:
        for c in sub:
            axis.setdefault(c, len(axis))
    order = _Letters(axis)  # MLX iterates its letter -> axis map in hash order
    aligned = []
    for x, sub in zip(xs, subs):
        if x.ndim != len(axis):
            x = reshape(x, list(x.shape) + [1] * (len(axis) - x.ndim), stream=s)
        slot = {c: i for i, c in enumerate(sub)}
        for c in order:
            if c not in slot:
                slot[c] = len(slot)
        perm = [slot[c] for c in axis]
        if perm != sorted(perm):
            x = transpose(x, perm, stream=s)
        aligned.append(x)
    r = aligned[0]
    for x in aligned[1:]:
        r = multiply(r, x, stream=s)
    sum_axes = [ax for c, ax in axis.items() if c not in out]
    if sum_axes:
        r = _sum(r, sum_axes, False, stream=s)
    perm = [axis[c] - len([a for a in sum_axes if axis[c] > a]) for c in out]
    return transpose(r, perm, stream=s)


def _build(path: list, plans: list, operands: tuple, s) -> array:
    from . import sum as _sum

    xs = list(operands)
    for node, preps in zip(path, plans):
        for p, pos in zip(preps, node.positions):
            if p.repeats:
                xs[pos] = _collapse(xs[pos], p, s)
            if p.sum_axes:
                xs[pos] = _sum(xs[pos], p.sum_axes, False, stream=s)
        finals = [p.final for p in preps]
        ops_ = [xs[pos] for pos in node.positions]
        if _can_dot(finals, node.output):
            r = _dot(ops_[0], ops_[1], finals[0], finals[1], node.output, s)
        else:
            r = _naive(ops_, finals, node.output, s)
        for pos in reversed(node.positions):
            del xs[pos]
        xs.append(r)
    return xs[0]


# --------------------------------------------------------------------------- the API

def _check_args(fname: str, sig: str, subscripts: Any, operands: tuple, **kw: Any) -> None:
    if not isinstance(subscripts, str):
        raise incompatible(fname, sig, subscripts, *operands, **kw)
    for x in operands:
        if not isinstance(x, array):
            raise RuntimeError("std::bad_cast")


def einsum(subscripts: str, *operands: array, stream: StreamOrDevice = None) -> array:
    """Einstein summation over ``operands`` as ``subscripts`` says, in MLX's greedy order."""
    kw = {} if stream is None else {"stream": stream}
    _check_args("einsum", _EINSUM_SIG, subscripts, operands, **kw)
    path, _ = _path("einsum", subscripts, operands)
    plans = _check_plan(path, operands)
    return _build(path, plans, operands, resolve_stream(stream))


def einsum_path(subscripts: str, *operands: array) -> tuple[list, str]:
    """The contraction order MLX would use (a list of position tuples) and a summary."""
    _check_args("einsum_path", _PATH_SIG, subscripts, operands)
    path, info = _path("einsum_path", subscripts, operands)
    text = (f"  Complete contraction:  {subscripts}\n"
            f"         Naive scaling:  {info.naive_scaling}\n"
            f"     Optimized scaling:  {info.optimized_scaling}\n"
            f"      Naive FLOP count:  {info.naive_cost}\n"
            f"  Optimized FLOP count:  {info.optimized_cost}\n")
    return [tuple(n.positions) for n in path], text
