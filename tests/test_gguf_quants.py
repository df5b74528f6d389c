"""GGUF's quantized tensors as MLX reads them (mlx/io/gguf_quants.cpp, mlx/io/gguf.cpp):
hand-built Q4_0 / Q4_1 / Q8_0 blocks unpacked into (weight, scales, biases) and checked
against numpy in float64; Q2_K / Q4_K / Q6_K / BF16 to float16 against the ``gguf``
package's dequantization; the refusals with MLX's messages."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tapescope.core as mx
from conftest import mlx_ref

Q4_0, Q4_1, Q8_0, Q5_0, Q2_K, Q4_K, Q6_K, BF16 = 2, 3, 8, 6, 10, 12, 14, 30


def _gguf(path, t, rows, cols, blob, name=b"blk.0.weight"):
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 1, 0))
        f.write(struct.pack("<Q", len(name)) + name)
        f.write(struct.pack("<IQQIQ", 2, cols, rows, t, 0))
        f.write(b"\x00" * (-f.tell() % 32))
        f.write(blob)
    return path


def _halves(rng, n):
    return rng.uniform(-2, 2, (n, 1)).astype(np.float16)


def _affine_blocks(rng, t, n):
    """(the file's blocks, q as the integers MLX stores, scale, bias) in float64."""
    d = _halves(rng, n)
    if t == Q8_0:
        q8 = rng.integers(-128, 128, (n, 32)).astype(np.int8)
        return (np.concatenate([d.view(np.uint8), q8.view(np.uint8)], 1),
                q8.astype(np.int64) + 128, d, d.astype(np.float64) * -128)
    q4 = rng.integers(0, 16, (n, 32)).astype(np.uint8)
    nib = (q4[:, :16] | (q4[:, 16:] << 4)).astype(np.uint8)  # GGML's nibble order
    if t == Q4_0:
        return np.concatenate([d.view(np.uint8), nib], 1), q4, d, d.astype(np.float64) * -8
    m = _halves(rng, n)
    return (np.concatenate([d.view(np.uint8), m.view(np.uint8), nib], 1), q4, d,
            m.astype(np.float64))


def _unpack(weight: np.ndarray, bits: int) -> np.ndarray:
    """MLX's affine packing read back: element i of a row in bits [bits*i, bits*(i+1))."""
    w = weight.astype(np.uint64)
    per = 32 // bits
    shifts = (np.arange(per, dtype=np.uint64) * np.uint64(bits))
    vals = (w[..., None] >> shifts) & np.uint64((1 << bits) - 1)
    return vals.reshape(weight.shape[:-1] + (-1,)).astype(np.int64)


@settings(max_examples=15, deadline=None)
@given(t=st.sampled_from([Q4_0, Q4_1, Q8_0]), rows=st.integers(1, 3),
       groups=st.integers(1, 4), seed=st.integers(0, 2**31))
def test_q4_0_q4_1_q8_0_unpack_into_mlxs_affine_form(tmp_path_factory, t, rows, groups, seed):
    rng = np.random.default_rng(seed)
    cols, n = 32 * groups, rows * groups
    blocks, q, d, bias = _affine_blocks(rng, t, n)
    path = _gguf(str(tmp_path_factory.mktemp("q") / "q.gguf"), t, rows, cols, blocks.tobytes())
    got = mx.load(path)
    assert sorted(got) == ["blk.0.biases", "blk.0.scales", "blk.0.weight"]
    bits = 8 if t == Q8_0 else 4
    w, s, b = got["blk.0.weight"], got["blk.0.scales"], got["blk.0.biases"]
    assert (w.dtype, w.shape) == (mx.uint32, (rows, cols * bits // 32))
    assert (s.dtype, s.shape, b.dtype, b.shape) == (mx.float16, (rows, groups),
                                                    mx.float16, (rows, groups))
    np.testing.assert_array_equal(_unpack(np.array(w), bits), q.reshape(rows, cols))
    np.testing.assert_array_equal(np.array(s), d.reshape(rows, groups))
    np.testing.assert_array_equal(np.array(b).astype(np.float64), bias.reshape(rows, groups))
    # the format's value, d * q (+ m), in float64 against MLX's dequantize in float32
    value = (d.astype(np.float64) * q + bias).reshape(rows, cols)
    deq = mx.dequantize(w, s.astype(mx.float32), b.astype(mx.float32), group_size=32,
                        bits=bits)
    np.testing.assert_array_equal(np.array(deq).astype(np.float64), value)
    if mlx_ref is not None:  # MLX itself: the same three arrays, bit for bit
        ref = mlx_ref.load(path)
        for k in got:
            np.testing.assert_array_equal(np.array(got[k]), np.array(ref[k]))


def _k_blocks(rng, t, n):
    size = {Q2_K: 84, Q4_K: 144, Q6_K: 210}[t]
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
    for at in {Q2_K: (80, 82), Q4_K: (0, 2), Q6_K: (208,)}[t]:  # finite f16 scales
        raw[:, at:at + 2] = _halves(rng, n).view(np.uint8)
    return raw


@pytest.mark.parametrize("t", [Q2_K, Q4_K, Q6_K, BF16])
def test_k_quants_and_bf16_dequantize_to_float16_as_ggml(tmp_path, t):
    gq = pytest.importorskip("gguf.quants")
    from gguf.constants import GGMLQuantizationType

    rng = np.random.default_rng(t)
    rows, cols = 3, 512
    if t == BF16:
        f32 = rng.standard_normal(rows * cols).astype(np.float32)
        raw = (f32.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
    else:
        raw = _k_blocks(rng, t, rows * cols // 256).reshape(rows, -1)
    path = _gguf(str(tmp_path / "k.gguf"), t, rows, cols, raw.tobytes())
    got = mx.load(path)["blk.0.weight"]
    assert (got.dtype, got.shape) == (mx.float16, (rows, cols))
    want = gq.dequantize(raw, GGMLQuantizationType(t)).astype(np.float16)
    np.testing.assert_array_equal(np.array(got), want)
    if mlx_ref is not None and t != Q4_K:
        # (MLX's gguflib dequantizes Q4_K with each pair's first scale and min for both of
        # its sub-blocks: half the weights wrong; PARITY.md)
        np.testing.assert_array_equal(np.array(got), np.array(mlx_ref.load(path)["blk.0.weight"]))


def _error(module, path):
    try:
        module.load(path)
    except Exception as e:  # noqa: BLE001 - compared between MLX and us
        return type(e), str(e)
    return None


@pytest.mark.parametrize("case", ["Q5_0", "last dim 16", "short data"])
def test_unreadable_quantized_tensors_are_refused_with_mlxs_errors(tmp_path, case):
    t, cols, blob = {"Q5_0": (Q5_0, 32, b"\0" * 22), "last dim 16": (Q4_0, 16, b"\0" * 18),
                     "short data": (Q8_0, 64, b"\0" * 40)}[case]
    path = _gguf(str(tmp_path / "bad.gguf"), t, 1, cols, blob)
    want = {"Q5_0": "[load_gguf] gguf_tensor_to_f16 failed",
            "last dim 16": "[load_gguf] tensor blk.0.weighthas incompatible last dim shape: 16",
            "short data": "[load_gguf] Tensor 'blk.0.weight' extends past the end of the file. "
                          "Perhaps an incomplete download or corrupt file?"}[case]
    assert _error(mx, path) == (RuntimeError, want)
    if mlx_ref is not None:
        assert _error(mlx_ref, path) == (RuntimeError, want)
