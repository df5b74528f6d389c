"""tapescope.settings: one object for every mode and switch, one parsing rule, environment
variables as the initial values, a context manager, and the older functions as its views."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import tapescope
from tapescope.core import fusion
from tapescope.kernels import backends
from tapescope.kernels import disk_cache
from tapescope.kernels.cpu import tiered
from tapescope.kernels.metal import shim
from tapescope.kernels.settings import SETTINGS, Settings, setting


def _fresh(monkeypatch, **env) -> Settings:
    for s in SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return Settings()


@pytest.mark.parametrize("raw, want", [
    ("1", True), ("true", True), ("Yes", True), ("ON", True), (" 1 ", True),
    ("0", False), ("false", False), ("No", False), ("off", False), ("", False),
])
def test_a_switch_reads_one_rule_so_zero_means_off(monkeypatch, raw, want):
    s = _fresh(monkeypatch, TAPESCOPE_DISABLE_GPU=raw, TAPESCOPE_TIERED=raw)
    assert s.disable_gpu is want and s.tiered is want


def test_disable_gpu_zero_leaves_a_registered_gpu_visible(monkeypatch):
    from conftest import registered_as_gpu
    from test_backends import NumpyGpu

    gen = registered_as_gpu(NumpyGpu())
    next(gen)
    try:
        monkeypatch.setenv("TAPESCOPE_DISABLE_GPU", "0")
        assert backends.gpu_available()
        monkeypatch.setenv("TAPESCOPE_DISABLE_GPU", "1")
        assert not backends.gpu_available()
    finally:
        monkeypatch.delenv("TAPESCOPE_DISABLE_GPU")
        gen.close()


def test_a_bad_value_is_an_error_naming_the_variable(monkeypatch):
    s = _fresh(monkeypatch, TAPESCOPE_TIERED="maybe", TAPESCOPE_FUSION="fast")
    with pytest.raises(ValueError, match=r"TAPESCOPE_TIERED='maybe': expected 1/0, true/false"):
        s.tiered
    with pytest.raises(ValueError, match=r"TAPESCOPE_FUSION='fast': expected one of 'mlx', 'extended'"):
        s.fusion


def test_unset_gives_the_defaults(monkeypatch):
    s = _fresh(monkeypatch)
    assert {n: getattr(s, n) for n in s} == {d.name: d.default for d in SETTINGS}


def test_an_assignment_wins_until_the_variable_changes(monkeypatch):
    s = _fresh(monkeypatch, TAPESCOPE_TIERED="1")
    assert s.tiered is True
    s.tiered = False
    assert s.tiered is False  # the variable has not changed since: the assignment holds
    monkeypatch.setenv("TAPESCOPE_TIERED", "yes")
    assert s.tiered is True


def test_assignments_are_checked():
    s = Settings()
    with pytest.raises(ValueError, match="Unknown fusion 'fast'"):
        s.fusion = "fast"
    with pytest.raises(TypeError, match="tiered is a switch"):
        s.tiered = "yes"
    with pytest.raises(AttributeError, match="No setting named 'tiring'"):
        s.tiring = True
    with pytest.raises(AttributeError, match="No setting named 'tiring'"):
        s.tiring


def test_the_context_manager_sets_for_a_block_and_restores_after_it(monkeypatch):
    for name in ("TAPESCOPE_FUSION", "TAPESCOPE_TIERED", "TAPESCOPE_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    st = tapescope.settings
    before = (st.fusion, st.tiered, st.cache_dir)
    with st(fusion="extended", tiered=True, cache_dir="/tmp/somewhere"):
        assert tapescope.fusion_mode() == "extended" and fusion._MODE[0] == "extended"
        assert tapescope.tiered() is True and tiered.tiered() is True
        assert str(disk_cache.cache_root()) == "/tmp/somewhere"
    assert (st.fusion, st.tiered, st.cache_dir) == before
    assert fusion._MODE[0] == before[0]
    with pytest.raises(RuntimeError):
        with st(tiered=True):
            raise RuntimeError("inside")
    assert st.tiered == before[1]
    with pytest.raises(ValueError):  # checked before anything is set
        st(tiered=True, fusion="fast")
    assert st.tiered == before[1]


def test_the_older_functions_are_views_of_the_settings():
    st = tapescope.settings
    try:
        prev = st.tiered
        assert tapescope.set_tiered(True) is prev
        assert st.tiered is True and tapescope.set_tiered(True) is True
        tapescope.set_fusion("extended")
        assert st.fusion == "extended" and fusion._MODE[0] == "extended"
        prev = st.metal_shim
        assert shim.enable(True) is prev and st.metal_shim is True and shim.enabled()
    finally:
        tapescope.set_tiered(False)
        tapescope.set_fusion("mlx")
        shim.enable(False)
    assert not st.tiered and st.fusion == "mlx" and not st.metal_shim


def test_every_setting_is_documented_with_its_variable():
    rows = tapescope.settings.describe()
    assert [r["name"] for r in rows] == [s.name for s in SETTINGS]
    for r in rows:
        # tapescope's own variables, and MLX's where the setting is MLX's (MLX_ENABLE_TF32)
        assert r["env"].startswith(("TAPESCOPE_", "MLX_")) and r["doc"]
    assert setting("fusion").choices == fusion.MODES


def test_the_environment_gives_the_initial_values_in_a_new_process():
    code = ("import tapescope; s = tapescope.settings;"
            "print(s.fusion, s.tiered, s.disable_gpu, tapescope.fusion_mode(), tapescope.tiered())")
    env = dict(os.environ, TAPESCOPE_FUSION="Extended", TAPESCOPE_TIERED="on",
               TAPESCOPE_DISABLE_GPU="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["extended", "True", "False", "extended", "True"]
