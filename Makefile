# tapescope: `make demo`, `make test`, `make lab`. Each makes .venv when it is missing and
# installs what it needs into it; graphviz (the `dot` program) is installed when missing
# and we are root with apt-get, otherwise the command to install it is printed. `make test`
# also installs Debian's chromium and chromium-driver the same way (the real-browser test
# drives JupyterLab with them; as root it must run, elsewhere it skips and says why), and
# OpenMPI (openmpi-bin, libopenmpi-dev) for the mpi4py tests run under mpirun, the same way.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

.PHONY: demo test test-ub test-fuzz test-gpu test-mlx lab graphviz chromium mpi clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# Stamps: reinstall when pyproject.toml or setup.py change.
$(VENV)/.dev: $(PY) pyproject.toml setup.py kernels/_handle.c interactive/core/_call.c interactive/core/_loop.c interactive/core/_buffer.c
	$(PIP) install -e ".[dev]"
	@# the C extensions next to their sources, for the editable install: a compiled
	@# function's call, the eval loop's hot part, BufferHandle and the allocator's steps,
	@# the buffer protocol's C base type (Python < 3.12)
	$(PY) setup.py -q build_ext --inplace || echo "No C compiler: memoryview(mx.array) needs Python >= 3.12; the eval loop runs in Python."
	@# MLX is the reference the tests compare against; they skip those checks without it.
	$(PIP) install "mlx[cpu]" || echo "mlx[cpu] is not available here: tests against MLX will skip."
	touch $@

$(VENV)/.jupyter: $(VENV)/.dev
	$(PIP) install -e ".[dev,jupyter]"
	touch $@

graphviz:
	@if command -v dot >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  (apt-get update && apt-get install -y graphviz) || echo "Could not install graphviz; pictures will be unavailable."; \
	else \
	  echo "graphviz (the 'dot' program) is missing; install it with:"; \
	  echo "    sudo apt-get install -y graphviz      # Debian/Ubuntu"; \
	  echo "    brew install graphviz                 # macOS"; \
	fi

chromium:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  (apt-get update && apt-get install -y chromium chromium-driver) || echo "Could not install chromium; the browser test will fail as root."; \
	else \
	  echo "chromium and chromedriver are missing (the browser test will skip); install them with:"; \
	  echo "    sudo apt-get install -y chromium chromium-driver      # Debian/Ubuntu"; \
	fi

mpi:
	@if command -v mpirun >/dev/null 2>&1 && command -v mpicc >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  (apt-get update && apt-get install -y openmpi-bin libopenmpi-dev) || echo "Could not install OpenMPI; the MPI tests will fail as root."; \
	else \
	  echo "OpenMPI is missing (the MPI tests will skip); install it with:"; \
	  echo "    sudo apt-get install -y openmpi-bin libopenmpi-dev      # Debian/Ubuntu"; \
	fi

# The tour (notebooks/00_tour.ipynb) executed headlessly: build/tour.html (and tour-dark.html)
# with its pictures and widget snapshots, and a summary printed.
demo: $(VENV)/.dev graphviz
	$(PY) -m tapescope.demo

# The suite over every core (pytest-xdist; TEST_WORKERS=0: in one process), one file per
# worker at a time (a module's fixtures and its order-dependent checks stay in one process),
# the files in their order (the default, fewest tests last, would leave the one-test browser
# run, the longest, to the end), then the tests marked ``serial`` (they measure the machine,
# which other workers would share) alone, from the files that have them.
TEST_WORKERS ?= auto
SERIAL_TESTS := $(shell grep -l "pytest.mark.serial" tests/test_*.py)
test: mpi $(VENV)/.dev graphviz chromium
	$(PY) -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  -m "not serial" tests
	$(PY) -m pytest -p no:cacheprovider -m serial $(SERIAL_TESTS)

# Heavy modes (a sample of each runs in `make test`): every compile suite and the full variant
# sweep with kernels built under ASan + UBSan; 2,000 random compiled graphs against the
# op-by-op results, bit for bit, and one kernel over more than 2^32 elements (when 12 GiB are free);
# the reduction kernels' full sweep (CPU against float64 numpy, every CUDA kernel through nvcc,
# the MSL ones on the Metal shim); the hypothesis example counts and parameter sets that
# `make test` samples, in full (TAPESCOPE_FULL_SWEEP=1).
test-ub: $(VENV)/.dev
	$(PY) tests/run_sanitized.py $(PY) -m pytest -p no:cacheprovider -q tests/test_compile_api.py \
	  tests/test_compile_dags.py tests/test_compile_fastpath.py tests/test_compile_kernels.py \
	  tests/test_compile_ops.py tests/test_compile_variants.py tests/test_compile_fuzz.py
	$(PY) tests/run_sanitized.py $(PY) tests/compile_fuzz.py --graphs 300 --variants all

# The files whose sweeps `make test` samples: those importing tests/conftest.py's sweep (the
# stand-in CUDA case files, tests/cuda_*_fake_cases.py, run in processes of their own from
# tests/test_cuda_sdpa_fake.py), and those reading TAPESCOPE_REDUCTION_SWEEP.
SWEEP_TESTS := $(shell grep -l "from conftest import.*sweep" tests/test_*.py) \
  $(if $(shell grep -l "from conftest import.*sweep" tests/cuda_*_fake_cases.py),tests/test_cuda_sdpa_fake.py)
REDUCTION_SWEEP_TESTS := $(shell grep -l "TAPESCOPE_REDUCTION_SWEEP" tests/test_*.py)
test-fuzz: $(VENV)/.dev
	$(PY) tests/compile_fuzz.py --graphs 2000 --variants none --huge
	@# the file readers' mutation fuzzer: thousands of malformed files per format
	TAPESCOPE_READER_FUZZ_EXAMPLES=3000 $(PY) -m pytest -q -p no:cacheprovider tests/test_reader_fuzz.py
	TAPESCOPE_REDUCTION_SWEEP=1 $(PY) -m pytest -p no:cacheprovider -q $(REDUCTION_SWEEP_TESTS)
	@# every autodiff case's check of its vjp and jvp (make test checks every twelfth)
	TAPESCOPE_GRAD_SWEEP=1 $(PY) -m pytest -p no:cacheprovider -q tests/test_check_grad.py
	@# the heaviest sweeps `make test` samples (tests/conftest.py: sweep), in full
	TAPESCOPE_FULL_SWEEP=1 $(PY) -m pytest -p no:cacheprovider -q $(SWEEP_TESTS)

# MLX's own Python tests (python/tests of ml-explore/mlx at 846d17622, fetched by hand: CI
# cannot) against tapescope.core, one file at a time: per file, how many of the tests MLX
# 0.32.4 passes pass here (PARITY.md). DEVICE=gpu runs them on the GPU; MLX_SKIP=test_quantized
# leaves files out; MLX_TIMEOUT is seconds per file.
MLX_SKIP ?=
MLX_TIMEOUT ?= 900
test-mlx: $(VENV)/.dev
	@test -n "$(MLX_TESTS)" || { echo "make test-mlx MLX_TESTS=path/to/mlx/python/tests"; exit 2; }
	$(PY) tests/mlx_suite.py $(MLX_TESTS) --timeout $(MLX_TIMEOUT) $(foreach f,$(MLX_SKIP),--skip $(f)) -v

# On the GPU machine (CuPy, JAX, pytest-xdist there; no .venv): the suite with the CPU as
# default device, then the CUDA runtime's suites with the GPU as default (tests/run_gpu_suites.sh).
test-gpu:
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .
	PY=$(PYTHON) bash tests/run_gpu_suites.sh

# As root (a container, CI) JupyterLab refuses to start without --allow-root.
lab: $(VENV)/.jupyter graphviz
	$(VENV)/bin/jupyter lab notebooks $$([ "$$(id -u)" = 0 ] && echo --allow-root)

clean:
	rm -rf build *.egg-info .pytest_cache .hypothesis
