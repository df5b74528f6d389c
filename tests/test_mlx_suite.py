"""tests/mlx_suite.py's own logic (MLX's test files themselves are a development tool's input,
which CI cannot fetch): the pytest ids it gives unittest tests, the count against the list of
tests MLX passes, and, on tiny fake test files, that a file runs against tapescope.core, that
a failing subtest fails its test, and that a file whose process dies keeps the tests that
finished and reports the one that was running."""

from __future__ import annotations

import contextlib
import io
import json
import textwrap
import unittest

import pytest

import mlx_suite
from conftest import mlx_ref


class _Case(unittest.TestCase):
    def test_x(self):
        pass


def test_ids_are_pytest_ids_of_the_file():
    assert mlx_suite.test_id(_Case("test_x")) == "test_mlx_suite.py::_Case::test_x"


def test_tally_counts_only_listed_tests_that_passed():
    expected = {"f.py::T::a", "f.py::T::b", "f.py::T::c", "f.py::T::e"}
    results = {"f.py::T::a": ("passed", ""), "f.py::T::b": ("failed", "AssertionError"),
               "f.py::T::d": ("passed", ""), "f.py::T::e": ("skipped", "no GPU")}
    assert mlx_suite.tally(expected, results) == (1, ["f.py::T::b", "f.py::T::c", "f.py::T::e"])


FAKE = '''
import os
import unittest

import mlx.core as mx
import tapescope.core


class TestFake(unittest.TestCase):
    def test_is_tapescope(self):
        self.assertIs(mx, tapescope.core)
        self.assertEqual(mx.array([1, 2]).sum().item(), 3)

    def test_fails(self):
        self.assertEqual(1, 2)

    def test_subtest_fails(self):
        for i in range(2):
            with self.subTest(i=i):
                self.assertEqual(i, 0)

    def test_not_listed(self):
        pass
'''

CRASH = '''
import os
import unittest


class TestCrash(unittest.TestCase):
    def test_a_first(self):
        pass

    def test_b_dies(self):
        os._exit(3)

    def test_c_never_runs(self):
        pass
'''

INTERRUPTED = '''
import unittest


class TestInterrupted(unittest.TestCase):
    def test_a_raises_keyboard_interrupt(self):
        raise KeyboardInterrupt("an eval stopped")

    def test_b_never_runs(self):
        pass
'''


@pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed: the files import mlx.core")
def test_fake_files_are_counted_against_the_list(tmp_path):
    (tmp_path / "test_fake.py").write_text(textwrap.dedent(FAKE))
    (tmp_path / "test_crash.py").write_text(textwrap.dedent(CRASH))
    (tmp_path / "test_interrupted.py").write_text(textwrap.dedent(INTERRUPTED))
    ref = tmp_path / "passed.json"
    ref.write_text(json.dumps({"cpu": {
        "test_fake": ["test_fake.py::TestFake::test_is_tapescope", "test_fake.py::TestFake::test_fails",
                      "test_fake.py::TestFake::test_subtest_fails"],
        "test_crash": ["test_crash.py::TestCrash::test_a_first", "test_crash.py::TestCrash::test_b_dies",
                       "test_crash.py::TestCrash::test_c_never_runs"],
        "test_interrupted": ["test_interrupted.py::TestInterrupted::test_a_raises_keyboard_interrupt",
                             "test_interrupted.py::TestInterrupted::test_b_never_runs"]}}))
    details = tmp_path / "details.json"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = mlx_suite.main([str(tmp_path), "--reference", str(ref), "--details", str(details)])
    lines = {line.split()[0]: line.split() for line in out.getvalue().splitlines()[1:]}
    assert lines["test_fake"][1:4] == ["1", "/", "3"]
    assert lines["test_crash"][1:4] == ["1", "/", "3"] and "exit 3" in out.getvalue()
    # a KeyboardInterrupt escapes unittest after its stopTest: the test is failed, not passed
    assert lines["test_interrupted"][1:4] == ["0", "/", "2"] and "exit -2" in out.getvalue()
    assert lines["total"][1:4] == ["2", "/", "8"] and rc == 1
    got = json.loads(details.read_text())
    assert got["test_fake.py::TestFake::test_fails"]["status"] == "failed"
    assert got["test_fake.py::TestFake::test_subtest_fails"]["status"] == "failed"
    assert got["test_crash.py::TestCrash::test_b_dies"]["status"] == "unfinished"
    assert got["test_crash.py::TestCrash::test_c_never_runs"]["status"] == "not run"
    a = got["test_interrupted.py::TestInterrupted::test_a_raises_keyboard_interrupt"]
    assert a["status"] == "failed" and "an eval stopped" in a["detail"]
