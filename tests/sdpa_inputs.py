"""What the scaled dot-product attention tests share: the dtypes by name, and a case's random
inputs (``inputs``), which the primitive's tests (``test_sdpa.py``), the CPU kernels'
(``test_sdpa_kernels.py``), the CUDA prefill kernel's on the host
(``test_sdpa_flash_host.py``) and over the stand-in driver (``cuda_sdpa_flash_fake_cases.py``)
and the GPU's (``test_cuda_fast.py``) draw alike."""

from __future__ import annotations

import ml_dtypes
import numpy as np

import tapescope.core as mx

BF16 = np.dtype(ml_dtypes.bfloat16)
MXD = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
NPD = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": BF16}


def inputs(B: int, kv: int, reps: int, L: int, kL: int, D: int, mask, sinks: bool,
           dtype: str, seed: int) -> tuple:
    """Numpy (q, k, v, mask, sinks) of ``dtype`` (a name of ``NPD``), standard normal from
    ``seed``: q (B, kv * reps, L, D), k and v (B, kv, kL, D), one sink per query head or
    None. ``mask``: None or ``causal`` (no array), ``bool`` (one per score, True with
    probability 0.7), ``bool_bcast`` (one (L, kL), True with probability 0.5, for every
    batch and head) or ``additive`` (standard normal, (1, kv * reps, L, kL): one over the
    batch)."""
    rng = np.random.default_rng(seed)
    t = NPD[dtype]
    q = rng.standard_normal((B, kv * reps, L, D)).astype(t)
    k = rng.standard_normal((B, kv, kL, D)).astype(t)
    v = rng.standard_normal((B, kv, kL, D)).astype(t)
    m = None
    if mask == "bool":
        m = rng.random((B, kv * reps, L, kL)) > 0.3
    elif mask == "bool_bcast":
        m = rng.random((L, kL)) > 0.5
    elif mask == "additive":
        m = rng.standard_normal((1, kv * reps, L, kL)).astype(t)
    s = rng.standard_normal(kv * reps).astype(t) if sinks else None
    return q, k, v, m, s
