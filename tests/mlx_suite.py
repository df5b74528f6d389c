"""MLX's own Python tests (``python/tests`` of ml-explore/mlx) run against ``tapescope.core``.

``python tests/mlx_suite.py MLX_TESTS [test_x ...]`` (``make test-mlx MLX_TESTS=...``) runs
each of MLX's test files in its own process, one at a time, after ``tapescope.as_mlx()``: its
``import mlx.core as mx`` is ``tapescope.core`` and ``mlx.nn`` / ``mlx.optimizers`` /
``mlx.utils`` are MLX's installed Python modules over it. It prints, per file, how many of
the tests MLX 0.32.4 itself passes (the list in ``shared/reference/mlx_tests_passed.json``:
``cpu``, or ``cuda`` with ``DEVICE=gpu``) pass here. A development tool: CI cannot fetch
MLX's tests, so ``make test`` does not need it.

A test with a failing subtest counts as failed, as in the reference list. A file that runs
past ``--timeout`` or kills its process keeps the results of the tests that finished; the
test that was running is reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
# the list of tests MLX passes: ../shared beside the checkout, or $MLX_REFERENCE (a machine
# the checkout alone travels to, such as the GPU host, carries it)
REFERENCE = Path(os.environ.get("MLX_REFERENCE") or
                 HERE.parent.parent / "shared" / "reference" / "mlx_tests_passed.json")
PASSED, FAILED, SKIPPED, UNFINISHED = "passed", "failed", "skipped", "unfinished"


def test_id(test: unittest.TestCase) -> str:
    """pytest's id of a unittest test (``test_ops.py::TestOps::test_add``), the list's form."""
    module, cls, method = test.id().rsplit(".", 2)
    return f"{module.rsplit('.', 1)[-1]}.py::{cls}::{method}"


def reference(path: Path, backend: str) -> dict[str, set[str]]:
    """File stem -> the ids MLX itself passes on ``backend`` (``cpu`` or ``cuda``)."""
    with open(path) as f:
        return {stem: set(ids) for stem, ids in json.load(f)[backend].items()}


def tally(expected: set[str], results: dict[str, tuple[str, str]]) -> tuple[int, list[str]]:
    """How many of the ``expected`` ids passed in ``results`` (id -> (status, detail)), and
    the expected ids that did not, sorted. An id missing from ``results`` did not pass."""
    missing = sorted(i for i in expected if results.get(i, (None,))[0] != PASSED)
    return len(expected) - len(missing), missing


class _Recorder(unittest.TestResult):
    """Writes one JSON line per test as it starts and ends, flushed, so a parent that kills
    the process keeps what finished."""

    def __init__(self, out):
        super().__init__()
        self.out = out
        self.status: dict[str, tuple[str, str]] = {}

    def _write(self, **rec) -> None:
        self.out.write(json.dumps(rec) + "\n")
        self.out.flush()

    def _fail(self, test, err) -> None:
        detail = "".join(traceback.format_exception_only(*err[:2])).strip()
        if test_id(test) not in self.status or self.status[test_id(test)][0] != FAILED:
            self.status[test_id(test)] = (FAILED, detail[-2000:])

    def startTest(self, test) -> None:
        super().startTest(test)
        self.current = test_id(test)
        self._t0 = time.perf_counter()
        self._write(id=test_id(test), status="started")

    def stopTest(self, test) -> None:
        super().stopTest(test)
        status, detail = self.status.get(test_id(test), (PASSED, ""))
        self._write(id=test_id(test), status=status, detail=detail,
                    seconds=round(time.perf_counter() - self._t0, 3))

    def addError(self, test, err) -> None:
        self._fail(test, err)

    def addFailure(self, test, err) -> None:
        self._fail(test, err)

    def addSubTest(self, test, subtest, err) -> None:
        if err is not None:
            self._fail(test, err)

    def addSkip(self, test, reason) -> None:
        self.status[test_id(test)] = (SKIPPED, reason)

    def addUnexpectedSuccess(self, test) -> None:
        self.status[test_id(test)] = (FAILED, "unexpected success")


def _child(path: Path, out: Path) -> None:
    """Run one of MLX's test files on tapescope (the ``--child`` process)."""
    from tapescope.as_mlx import as_mlx

    as_mlx()
    sys.path.insert(0, str(path.parent))  # mlx_tests.py, MLX's TestCase base
    os.chdir(path.parent)  # some files read fixtures beside them
    suite = unittest.defaultTestLoader.loadTestsFromName(path.stem)
    with open(out, "a") as f:
        rec = _Recorder(f)
        try:
            suite.run(rec)
        except KeyboardInterrupt as e:  # unittest lets it through after stopTest said "passed"
            if getattr(rec, "current", None) is not None:
                detail = "".join(traceback.format_exception_only(type(e), e)).strip()
                rec._write(id=rec.current, status=FAILED, detail=detail[-2000:], seconds=0)
            raise


def read_results(out: Path) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """The finished tests' (status, detail) by id, and the ids started but not finished."""
    results, started = {}, []
    if out.exists():
        for line in out.read_text().splitlines():
            rec = json.loads(line)
            if rec["status"] == "started":
                started.append(rec["id"])
            else:
                results[rec["id"]] = (rec["status"], rec["detail"])
    return results, [i for i in started if i not in results]


def run_file(path: Path, timeout: float) -> tuple[dict[str, tuple[str, str]], str]:
    """One file in a child process: its results and how the process ended."""
    env = dict(os.environ)
    if env.get("DEVICE") == "gpu":
        env.setdefault("TAPESCOPE_CUDA", "1")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.jsonl"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(path), str(out)]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            ended = "ok" if proc.returncode in (0, 1) and out.exists() else f"exit {proc.returncode}"
            if ended != "ok":
                ended += ": " + proc.stderr.strip()[-1500:]
        except subprocess.TimeoutExpired:
            ended = f"timed out after {timeout:.0f} s"
        results, unfinished = read_results(out)
    for i in unfinished:
        results[i] = (UNFINISHED, ended)
    return results, ended


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mlx_tests", type=Path, help="MLX's python/tests folder")
    p.add_argument("files", nargs="*", help="test files to run (stems; default: every listed file)")
    p.add_argument("--skip", action="append", default=[], help="a file stem not to run")
    p.add_argument("--timeout", type=float, default=900, help="seconds per file")
    p.add_argument("--reference", type=Path, default=REFERENCE)
    p.add_argument("--details", type=Path, help="write every non-passing test's detail here (JSON)")
    p.add_argument("-v", "--verbose", action="store_true", help="list the tests that do not pass")
    args = p.parse_args(argv)
    args.mlx_tests = args.mlx_tests.resolve()  # the child changes directory before importing
    backend = "cuda" if os.environ.get("DEVICE") == "gpu" else "cpu"
    if not args.reference.is_file():
        p.error(f"no list of the tests MLX passes at {args.reference} (--reference or MLX_REFERENCE)")
    if not args.mlx_tests.is_dir():
        p.error(f"{args.mlx_tests} is not a folder (MLX's python/tests)")
    ref = reference(args.reference, backend)
    stems = [s.removesuffix(".py") for s in args.files] or list(ref)
    skip = {s.removesuffix(".py") for s in args.skip}
    unknown = [s for s in stems if s not in ref]
    if unknown:
        p.error(f"not in the {backend} list of {args.reference}: {', '.join(unknown)}")
    total_pass = total_ref = 0
    details = {}
    print(f"MLX's tests on tapescope ({backend}; of the tests MLX 0.32.4 passes)")
    for stem in stems:
        if stem in skip:
            print(f"{stem:24s} skipped")
            continue
        t0 = time.perf_counter()
        results, ended = run_file(args.mlx_tests / f"{stem}.py", args.timeout)
        n, missing = tally(ref[stem], results)
        total_pass += n
        total_ref += len(ref[stem])
        note = "" if ended == "ok" else f"  ({ended.splitlines()[0][:80]})"
        print(f"{stem:24s} {n:4d} / {len(ref[stem]):4d}  {time.perf_counter() - t0:6.1f} s{note}",
              flush=True)
        for i in missing:
            status, detail = results.get(i, ("not run", ""))
            details[i] = {"status": status, "detail": detail}
            if args.verbose:
                print(f"    {i}: {status}: {detail.splitlines()[0][:160] if detail else ''}")
    print(f"{'total':24s} {total_pass:4d} / {total_ref:4d}")
    if args.details:
        args.details.write_text(json.dumps(details, indent=1, sort_keys=True))
    return 0 if total_pass == total_ref else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(main())
