"""``tapescope.kernel_cache()`` and ``tapescope.clear_kernel_cache()``: the compiled kernels."""

from __future__ import annotations

from tapescope.kernels.cpu import compiler


def kernel_cache() -> list:
    """One dict per cached kernel: name, runtime, variant, source, build ms, hits, misses,
    disk path, where it came from (built, disk, temp: built in a temporary folder because the
    disk cache could not be used, or a numpy fallback with its reason), ``cache_note``,
    why the disk cache was not used ("" when it was), ``interpreted``, the calls that ran
    interpreted while the kernel built (``tapescope.set_tiered``), and ``tape``, the fused tape it was
    generated from (``tapescope.kernel_sources.entry_sources`` renders its other dialects)."""
    return [
        {"name": e.name, "runtime": e.runtime, "variant": e.variant, "source": e.source,
         "build_ms": e.build_ms, "hits": e.hits, "misses": e.misses, "disk_path": e.disk_path,
         "origin": e.origin, "cache_note": e.cache_note, "tape": e.tape,
         "interpreted": e.interpreted}
        for e in compiler.entries()
    ]


def clear_kernel_cache(disk: bool = False) -> None:
    """Forget the in-process kernels; ``disk=True`` also deletes the on-disk cache (except
    folders their owner made read-only)."""
    compiler.clear(disk=disk)
