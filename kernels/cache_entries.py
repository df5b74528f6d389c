"""The kernel cache as a user lists it: ``tapescope.kernel_cache()`` (one dict per kernel, with
its roofline figures), ``tapescope.clear_kernel_cache()``, and ``entry_sources``, an entry's
source in every dialect (what the Cache widget and the Kernels tab show side by side)."""

from __future__ import annotations

from . import roofline, timeline
from .codegen.render import kernel_sources
from .cpu import compiler
from .kernel_registry import entries


def kernel_cache() -> list:
    """One dict per cached kernel: name, runtime, variant, source, build ms, hits, misses,
    disk path, where it came from (built, disk, temp: built in a temporary folder because the
    disk cache could not be used, or a numpy fallback with its reason), ``cache_note``,
    why the disk cache was not used ("" when it was), ``interpreted``, the calls that ran
    interpreted while the kernel built (``tapescope.set_tiered``), and ``tape``, the fused tape it was
    generated from (``entry_sources`` renders its other dialects),
    and ``roofline``: where its launches still on the timeline sit on the device's roofline
    (``roofline_columns``), None when none is recorded."""
    return listed(entries())


def listed(entries: list) -> list:
    """``kernel_cache()``'s dicts of some of the cache's entries (``kernel_registry.entries()``): the
    timeline is read once for their roofline columns, and not at all when there are none."""
    placed = roofline.kernel_rows(timeline.records()) if entries else {}
    return [
        {"name": e.name, "runtime": e.runtime, "variant": e.variant, "source": e.source,
         "build_ms": e.build_ms, "hits": e.hits, "misses": e.misses, "disk_path": e.disk_path,
         "origin": e.origin, "cache_note": e.cache_note, "tape": e.tape,
         "interpreted": e.interpreted, "roofline": roofline_columns(_placed_of(e, placed))}
        for e in entries
    ]


def _placed_of(e, placed: dict):
    """The roofline row of entry ``e``: its name on the CPU, its tape's name on the GPU
    (the GPU's device-time records name the tape, not the variant)."""
    p = placed.get(e.name)
    if p is None and e.tape is not None and e.runtime != "cpu":
        p = placed.get(e.tape.lib_name)
    return p


def roofline_columns(p) -> dict | None:
    """A kernel's roofline figures (a ``roofline.Placed``) as plain numbers: launches, median
    time (s), bytes read and written, bytes/s and its fraction of the copy bandwidth, FLOP/s
    and its fraction of peak, and why it is far from the roof ("" at the roof)."""
    if p is None:
        return None
    x = p.launch
    return {"launches": p.launches, "time_s": x.time_s, "bytes_read": x.bytes_read,
            "bytes_written": x.bytes_written, "bytes_per_s": x.bytes_per_s,
            "bandwidth_fraction": p.bandwidth_fraction, "flops_per_s": x.flops_per_s,
            "peak_fraction": p.peak_fraction, "why": p.why}


def clear_kernel_cache(disk: bool = False) -> None:
    """Forget the in-process kernels; ``disk=True`` also deletes the on-disk cache (except
    folders their owner made read-only)."""
    compiler.clear(disk=disk)


def entry_sources(entry: dict) -> dict:
    """runtime -> source for a ``kernel_cache()`` entry: the source it was built from (C, or
    CUDA for a GPU kernel) and the other dialects of the same tape and variant (only the
    built one when the entry kept no tape)."""
    tape = entry.get("tape")
    if tape is None:
        return {"cpu": entry["source"]} if entry.get("source") else {}
    runtime = entry.get("runtime", "cpu")
    built = {runtime: entry.get("source")} if runtime in ("cpu", "cuda") else {}
    return kernel_sources(tape, tape.lib_name, entry["variant"], built=built)
