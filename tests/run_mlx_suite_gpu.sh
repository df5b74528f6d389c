#!/usr/bin/env bash
# MLX's own Python tests on the GPU machine: the 19 core files of PARITY.md with DEVICE=gpu
# (the CUDA runtime registered: TAPESCOPE_CUDA=1), each file by tests/mlx_suite.py in its own
# process, JOBS files at a time on the one GPU, each under its own time limit; prints per
# file how many of the tests MLX 0.32.4 passes on CUDA pass here, and the total.
#
# Needs (the machine cannot download; carry one ignored folder, e.g. .mlx/):
#   MLX_TESTS      MLX's python/tests (ml-explore/mlx at 846d17622; 1.1 MB)
#   MLX_REFERENCE  shared/reference/mlx_tests_passed.json (../shared does not travel)
#   MLX_WHEEL      the mlx==0.32.4 wheel for the machine's Python (773 KB), for mlx.nn /
#                  mlx.optimizers / mlx.utils; installed with --no-deps into a --target folder
#                  put on PYTHONPATH. Its core library is never imported (tapescope.core takes
#                  its place; without libmlx it could not be). Not needed when mlx.nn imports.
#   e.g. here:  mkdir -p .mlx && cp -r /work/mlx-tests/python/tests .mlx/tests &&
#     cp ../shared/reference/mlx_tests_passed.json .mlx/ && echo /.mlx/ >> .git/info/exclude &&
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_35_x86_64 -d .mlx mlx==0.32.4
#   there (carry .mlx):  MLX_TESTS=.mlx/tests MLX_REFERENCE=.mlx/mlx_tests_passed.json \
#     MLX_WHEEL=.mlx bash tests/run_mlx_suite_gpu.sh
# Other settings: PY (python3), JOBS (4), EACH (seconds per file, 300), LIMIT (seconds for the
# whole run, 420), FILES (stems, default the 19), OUT (build/gpu: mlx_suite.txt, the log of
# every file, and mlx_suite.json, every non-passing test's detail, land there).
set -u
PY=${PY:-python3}
JOBS=${JOBS:-4}
EACH=${EACH:-300}
LIMIT=${LIMIT:-420}
OUT=${OUT:-build/gpu}
FILES=${FILES:-test_ops test_compile test_array test_autograd test_vmap test_blas test_linalg \
test_fft test_reduce test_random test_einsum test_eval test_device test_double test_bf16 \
test_constants test_threads test_memory test_graph}
: "${MLX_TESTS:?MLX_TESTS=path/to/mlx/python/tests}"
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# tapescope itself (the machine has no .venv): an editable install builds the C extensions
if ! "$PY" -c "import tapescope.core" 2>/dev/null; then
  "$PY" -m pip install -q --no-build-isolation --no-deps -e "$HERE/.." || exit 2
fi
# MLX's Python packages over tapescope.core: find_spec imports the namespace package only
if ! "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('mlx.nn') is None)" 2>/dev/null; then
  wheel=${MLX_WHEEL:-}
  [ -d "$wheel" ] && wheel=$(ls "$wheel"/mlx-0.32.4-*.whl 2>/dev/null | head -1)
  [ -f "$wheel" ] || { echo "mlx.nn is not importable: set MLX_WHEEL to the mlx==0.32.4 wheel"; exit 2; }
  "$PY" -m pip install -q --no-deps --no-compile --target "$WORK/mlx-site" "$wheel" || exit 2
  export PYTHONPATH="$WORK/mlx-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export DEVICE=${DEVICE:-gpu} PYTHONUNBUFFERED=1  # DEVICE=cpu: the same run on the CPU list
[ "$DEVICE" = gpu ] && export TAPESCOPE_CUDA=1
ref=()
[ -n "${MLX_REFERENCE:-}" ] && ref=(--reference "$MLX_REFERENCE")

t0=$(date +%s)
# each file gets EACH seconds or what is left of LIMIT when it starts, whichever is less (the
# suite keeps a timed-out file's finished tests); a file with under 20 s left is not started
printf '%s\n' $FILES | timeout -k 10 $((LIMIT + 60)) xargs -P "$JOBS" -I{} sh -c '
  left=$(( $7 + $8 - $(date +%s) )); t=$(( left < $3 ? left : $3 ))
  if [ "$t" -lt 20 ]; then echo "{}: not started (LIMIT)" > "$5/{}.txt"; exit 0; fi
  "$1" "$2/mlx_suite.py" "$4" {} --timeout "$t" --details "$5/{}.json" -v $6 > "$5/{}.txt" 2>&1
  true' _ "$PY" "$HERE" "$EACH" "$MLX_TESTS" "$WORK" "${ref[*]:-}" "$t0" "$LIMIT"

echo "MLX's tests on tapescope (DEVICE=$DEVICE; of the tests MLX 0.32.4 passes), $(( $(date +%s) - t0 )) s"
: > "$OUT/mlx_suite.txt"
for f in $FILES; do
  if [ -s "$WORK/$f.txt" ]; then
    line=$(grep -E "^$f[ :]" "$WORK/$f.txt" | head -1)
    echo "${line:-$f: no count (see mlx_suite.txt)}"
  else
    echo "$f: not finished within LIMIT=$LIMIT s"
  fi
  { echo "== $f"; cat "$WORK/$f.txt" 2>/dev/null; } >> "$OUT/mlx_suite.txt"
done
"$PY" - "$WORK" "$OUT/mlx_suite.json" $FILES <<'EOF'
import json, re, sys
from pathlib import Path
work, out, files = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
details, passed, listed = {}, 0, 0
for f in files:
    if (work / f"{f}.json").exists():
        details.update(json.loads((work / f"{f}.json").read_text()))
    text = (work / f"{f}.txt").read_text() if (work / f"{f}.txt").exists() else ""
    m = re.search(rf"^{f}\s+(\d+) /\s+(\d+)", text, re.M)
    if m:
        passed, listed = passed + int(m[1]), listed + int(m[2])
out.write_text(json.dumps(details, indent=1, sort_keys=True))
print(f"{'total (files that finished)':28s} {passed:4d} / {listed:4d}")
EOF
