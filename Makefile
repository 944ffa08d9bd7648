# kvpages: `make bench` runs the default sweep, `make test` runs the tests.
# Both create (or reuse) a virtual environment in $(VENV) and install what they need.
#
#   TORCH=torch==2.13.0  (default) the CPU wheel; on a CPU machine never leave torch unpinned
#   TORCH=system         reuse the torch of $(PYTHON) (e.g. your CUDA build): the venv sees its site-packages;
#                        with VENV=/path/to/an/existing/venv that has torch, that venv is used as it is
# With a pinned TORCH, pip only picks the torch file (its configuration finds the CPU wheel: `--dry-run --report`,
# nothing installed) while it installs $(UV) (the two at once: 1.7 s instead of 3.1 s on the dev box, 2026-12-05);
# uv then installs that file, pip and the rest together, unpacking on every core. Bytecode is written for what kvpages
# imports, by importing it once (the measuring side and torch beside the analysis side and its charts with matplotlib,
# pytest: 1,300 modules, 4 s of CPU), not for all 10,000 modules (uv's --compile-bytecode or compileall: 27 s of CPU);
# what a test imports besides is written the first time it runs.
# The venv is made without pip (ensurepip: 4 s) where $(PYTHON)'s own pip can install into it (--python, pip >= 22.3);
# else ensurepip gives it one. On the 2-core dev box, uv's cache empty each time, alternating (2026-12-05): set-up took
# 24.8, 30.8 and 34.6 s when pip installed torch, compileall compiled it and uv installed the rest, and 20.6 and 20.9 s
# so; a fresh clone's `.ci/run` (set-up, then `make test`) 190.9 and 189.8 s then, 177.2 and 173.6 s so.
# TORCH=system pip installs the rest: uv does not see a venv's system site-packages, and would fetch another torch.
#   PRESET=default       the sweep `make bench` runs: quick, default or full
#   PYTEST_ARGS=...      extra options for pytest, e.g. PYTEST_ARGS="--kv-page-sizes 1,64"
#   NOISE_PRESET=default the sweep `make noise` runs twice, back to back
#
# `make gpu-check` needs no venv and no network: it runs bench/gpu_check.sh with $(PYTHON) as it is
# (e.g. PYTHON=/opt/conda/bin/python, or PYTHON=.venv/bin/python), PYTEST_ARGS going to both of its sweeps.
#   ARCHIVE=dir          --archive dir
# Its usage, steps and exit status: `bash bench/gpu_check.sh --help`.

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
UV := uv==0.13.8
PRESET ?= default
PYTEST_ARGS ?=
NOISE_PRESET ?= default
NOISE_DIR ?= .noise

# Bytecode: where PYTHONDONTWRITEBYTECODE is set (as on the dev box), every Python process would compile kvpages
# from source again (0.1-0.2 s of CPU each: each kvpages command, each of a sweep's workers, each of the hundreds of
# processes the tests start) and every pytest session rewrite the test modules again; make's commands write it once.
unexport PYTHONDONTWRITEBYTECODE

BIN := $(VENV)/bin
STAMP := $(VENV)/.kvpages-installed

.PHONY: bench test lint noise gpu-check clean-venv

$(STAMP): pyproject.toml
ifeq ($(TORCH),system)
	test -x $(BIN)/python || $(PYTHON) -m venv --system-site-packages $(VENV)
	@$(BIN)/python -c "import torch; print('using torch', torch.__version__, 'from', torch.__file__)" 2>/dev/null || \
		{ echo "TORCH=system: $(PYTHON) has no torch to reuse; install your torch build into it, or leave TORCH unset for torch==2.13.0 (CPU)" >&2; rm -rf $(VENV); exit 2; }
	$(BIN)/python -m pip install -q -e ".[test]"
else
	test -x $(BIN)/python || $(PYTHON) -m venv --without-pip $(VENV)
	pip="$(PYTHON) -m pip --python $(BIN)/python"; $$pip --version > /dev/null 2>&1 || \
		{ $(BIN)/python -m ensurepip > /dev/null && pip="$(BIN)/python -m pip"; } && \
	report=$(VENV)/.torch-report; \
	{ $$pip install -q --dry-run --no-deps --ignore-installed --report - "$(TORCH)" > $$report 2> /dev/null & picking=$$!; } && \
	$$pip install -q --no-compile "$(UV)" && \
	{ wait $$picking && torch=$$($(BIN)/python -c \
		'import json, sys; got = json.load(sys.stdin)["install"][0]; print(got["metadata"]["name"], "@", got["download_info"]["url"])' \
		< $$report) && \
	  echo "uv installs $$torch (the file pip picked for $(TORCH)), pip and kvpages[test]"; } || \
	{ echo "pip did not report the file it picks (pip < 22.2, or no such torch): pip installs $(TORCH)"; \
	  $$pip install -q --no-compile "$(TORCH)" && torch=; } && \
	rm -f $$report && $(BIN)/uv pip install --python $(BIN)/python -q $${torch:+"$$torch"} pip -e ".[test]"
	$(BIN)/python -c 'import kvpages.measure.session' & warm=$$!; \
	$(BIN)/python -c 'import kvpages.cli, kvpages.plugin, kvpages.render.plots, pytest_benchmark.plugin' && wait $$warm
endif
	touch $(STAMP)

# --benchmark-quiet: kvpages prints its own summary (pytest-benchmark's table would list every one of ~3700 blocks);
# -p no:hypothesispytest: bench/ has no property tests, and hypothesis's plugin costs ~1.5 s at the end of a session;
# -p no:logging: no log capture (bench/ logs nothing; it attaches its handlers to the root and every non-propagating
# logger, torch's ~40, around each phase of a process's ~600 tests: ~0.4 s a process; --log-* options are then
# unknown); -p no:unraisableexception: no two full garbage collections at the end of the session (~0.3 s);
# -p no:xdist -p no:xdist.looponfail: pytest-xdist (installed for make test) and its execnet import (~0.1 s a process).
# --assert=plain: no assertion rewriting (bench/ asserts nothing; kvpages' own asserts are invariants). Its import hook
# is asked first about every module imported after pytest starts, torch's ~1,100 among them: a worker's start-up
# 3.81 -> 3.44 s of CPU (`pytest bench/ --collect-only`, six runs each, alternating, 2026-12-06).
# The worker processes leave out the same (kvpages/measure/workers.py).
BENCH_PYTEST := -q --benchmark-quiet --assert=plain -p no:hypothesispytest -p no:logging -p no:unraisableexception -p no:xdist -p no:xdist.looponfail

bench: $(STAMP)
	$(BIN)/python -m pytest bench/ --benchmark-only --kv-preset $(PRESET) --kv-analyze $(BENCH_PYTEST) $(PYTEST_ARGS)

# The tests run in $(TEST_WORKERS) pytest-xdist workers; gpu_check.sh's rehearsal runs once, in the background from
# collection on, for every worker (tests/conftest.py: pytest 9 drops the group suffix --dist loadgroup relied on, so
# each worker rehearsed again). On the 2-core dev box, 243 s of pytest in one process took 157 s so.
# mypy runs beside them (about 8 s of one core, no cache: pyproject.toml has it skip what kvpages never imports); its
# output is printed only when it fails, after the tests, so pytest's summary stays the last line of a pass.
# On the idle 2-core dev box, back to back (2026-12-05): make test after set-up 156 s at 9a32adc (259 s of CPU with
# every process it starts), 117 s now (209 s of CPU). What saved it: bytecode written (unexport above: each of the
# hundreds of Python processes the tests start compiled kvpages again, and each pytest session rewrote the test
# modules); load_run reading the reference run in 0.18 s instead of 0.47 s (each test that loads it); the analysis
# kept between a folder's commands (tests/conftest.py gives the session its own cache folder); 20 kvpages commands
# run in the test's own process (conftest.kvpages_here) where starting one is not what is tested; kvpages plot's
# drawing process warming matplotlib while the run is analysed. --dist loadfile instead (a module's fixtures built
# once) was tried: 5 s less CPU, no shorter. A fresh clone's `make test`, set-up included, back to back on the dev
# box: 176 s at 9a32adc (set-up 29.5 s, then 146.9 s), 146 s at cecd880 (set-up 21.5 s, then 124.5 s), 164 s at
# ae77f00 (then 139.5 s: 845 tests, the hybrid payloads' among them, and a reference run of twice the rounds); at
# 398c54f 173 s (then 149.2 s) and at ddce584 186 s (set-up 26 s, then 157.7 s: 856 tests). mypy without its cache is
# most of what a fresh clone's tests add: in the same sitting, pytest took 135 s in a tree whose mypy cache was kept
# and 151.5 s in the clone with only that cache removed (mypy at nice 19 beside them: 148.3 s, within the spread).
# At 259293c (2026-12-05), uv's cache warm: 163.3 s (set-up and ruff 13 s, then 150.4 s: 864 tests); -n 3 instead of 2 was
# slower (161.4 and 147.9 s against 144.2 and 143.0 s, alternating): the tests' processes keep both cores busy.
# A fresh clone's `.ci/run`, uv's cache emptied each time, alternating (2026-12-05, the box slowing over the sitting):
# 3aa3b94 160.0 and 171.2 s (pytest 142.0 and 147.4 s), 321901d 144.3 and 158.2 s (pytest 125.1 and 133.8 s). What
# saved it: mypy not reading what kvpages never imports (pyproject.toml: 16 -> 8 s of CPU); the cross-check's profiler
# started without torch.profiler's wrapper, which imported torch._inductor, dynamo and sympy (kvpages.measure.crosscheck);
# the two-rank run and the SGLang releases made once per session, not once per worker (conftest.built_once); a hung
# worker stopped at 2 s, not 4 s. Later that day (11:00-11:36 UTC, the box faster): 7f5e368 141.8 and 146.3 s,
# b7ae4dd 143.6 s, 9054f94 145.5, 143.7 and 147.7 s (pytest 124.2-128.9 s; set-up, mostly uv's downloads, 16.6-21.0 s).
# Later (12:50-14:04 UTC), ten fresh clones from 2ecb627 to 1ebdc39: 138.8-149.9 s in nine, 154.7 s in the last (set-up
# 11.8-19.6 s, pytest 122.4-132.5 s, the box slowing: a clone's second run took 118.2-123.9 s). A fresh clone's first
# run took 15 s more CPU than its second: mypy without its cache about 7 s, the rest bytecode and pytest's rewritten
# kvpages modules written (the first pytest process 0.9 s more than the next). Later (15:32-16:02 UTC, the box slower),
# five fresh clones each, alternating: 5b07a3c 145.4-147.8 s (set-up 16.0-17.7 s), 1072f6c and 29a82c0 139.4-142.9 s
# (set-up 11.2-17.3 s): the tests that mostly wait for a limit first, beside the rehearsal (tests/conftest.py), the
# controller of `pytest -n` starting its workers without importing torch (its conftest import 1.8 s -> 0.2 s), and pip
# picking the torch file while it installs uv.
# On a 2-core box about twice as slow (2026-12-05, 22:34-22:57 UTC), fresh clones' .ci/run alternating, uv's cache
# warm: 4ce4a84, which issue 40 gives as 168 s, 354.2 and 353.9 s (set-up 74 s, then pytest 280 s: 636 passed);
# 1c08f4e 299.6 and 308.8 s (set-up 17 s, then pytest 282.7 and 291.3 s: 888 passed), 0.85-0.87 of 4ce4a84's.
# The same box on a faster day (2026-12-06, 16:04-16:19 UTC, fresh clones, KVPAGES_CACHE empty, 4ce4a84 and 6164b2f
# alternating ABBA): 4ce4a84 239.8 and 226.9 s (pytest 193.0 and 181.3 s: 636 passed), 6164b2f 201.5 and 192.7 s
# (pytest 187.7 and 180.6 s: 902 passed), 0.840 and 0.849 of 4ce4a84's: 141-143 s scaled by its 168 s. Later that
# day (17:37-17:51 UTC, ABBA): 9102dff 187.7 and 192.9 s (905 passed), 4ce4a84 226.3 and 222.9 s: 0.830 and 0.866,
# 139-145 s scaled.
# Where its CPU goes (2026-12-07, cef5644; each Python process's own CPU logged as it exited): 296 s of CPU in a 154 s
# run. The 90 processes the tests start that import torch took 158 s, most of it that import (1.4-1.8 s of CPU
# alone, measured apart, the collector off and on); the two workers' in-process tests 71 s; the other processes (the
# charts', the notebook's kernel, mypy, ruff) the rest. Those fresh processes are what the tests of workers, ranks,
# signals and gpu_check.sh test. Fresh clones' .ci/run, ABBA with 4ce4a84 (06:30-06:43 UTC): 173.5 and 176.9 s
# against 206.9 and 207.0 s (pytest 163.6 and 166.4 s, 931 passed; 4ce4a84's 164.2 and 160.3 s, 636 passed): 0.839
# and 0.855, 141-144 s scaled by its 168 s.
TEST_WORKERS ?= 2
TEST_PYTEST := tests/ bench/ --benchmark-disable --kv-preset quick -q -n $(TEST_WORKERS) --dist loadgroup

test: $(STAMP)
	$(BIN)/python -m ruff check kvpages tests bench
	@log=$$(mktemp); $(BIN)/python -m mypy > $$log 2>&1 & types=$$!; \
	echo "mypy (beside the tests), then: pytest $(TEST_PYTEST) $(PYTEST_ARGS)"; \
	$(BIN)/python -m pytest $(TEST_PYTEST) $(PYTEST_ARGS); tests=$$?; \
	wait $$types || { cat $$log; echo "mypy failed" >&2; rm -f $$log; exit 1; }; rm -f $$log; exit $$tests

lint: $(STAMP)
	$(BIN)/python -m ruff check kvpages tests bench
	$(BIN)/python -m mypy

# Two runs of the same code, back to back, into a new folder under $(NOISE_DIR)/; then their A/A figures, the
# noise floor of each (between and within processes) and one line: is this box fit for comparisons?
noise: $(STAMP)
	@dir=$(NOISE_DIR)/$$(date -u +%Y%m%dT%H%M%SZ); mkdir -p $$dir && \
	for i in 1 2; do $(BIN)/python -m pytest bench/ --benchmark-only --kv-preset $(NOISE_PRESET) $(BENCH_PYTEST) \
		-p no:cacheprovider --kv-results $$dir $(PYTEST_ARGS) || exit $$?; done && \
	$(BIN)/kvpages noise $$(ls -d $$dir/*/)

gpu-check:
	PYTHON=$(PYTHON) bash bench/gpu_check.sh $(if $(ARCHIVE),--archive $(ARCHIVE)) $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
