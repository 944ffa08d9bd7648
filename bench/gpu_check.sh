#!/usr/bin/env bash
# make gpu-check: on a CUDA machine, in one go (about 2-4 minutes on an H200), with this machine's own
# python and torch, no pip and no network:
#   0. preflight: every package the steps need, and a CUDA device; one line naming what is missing if not,
#   1. the CUDA-marked tests (variants and inputs on CUDA, the meter against the CUDA profiler, the sweep's
#      CUDA twins: cross-check process and a disagreement routed to a mismatch row, pinned variant, run
#      folder; the busy-queue step: a blocking copy waits for a queued 500 us kernel, a pinned one does not),
#   2. a `quick` sweep on the GPU (profiler cross-check in its own process), points and scenarios (whole
#      requests, steps, the busy queue, the pinned worker-thread wait), written as a run folder to
#      results/ with charts, ratios.csv, scenarios.csv and REPORT.md,
#   3. the same sweep with the cross-check off, to show the timing process is not skewed by it.
# Uses $PYTHON (default: python3). Works without installing kvpages: the plugin is then loaded by name.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if ! "$PYTHON" -c "import importlib.metadata as m; m.distribution('kvpages')" 2>/dev/null; then
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTEST_PLUGINS=kvpages.plugin
fi
"$PYTHON" -m kvpages.preflight --cuda
nvidia-smi --query-gpu=name,uuid,driver_version,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current \
    --format=csv || true

echo "== CUDA-marked tests (variants, inputs, meter vs profiler, sweep twins)"
"$PYTHON" -m pytest tests/test_variants.py tests/test_inputs.py tests/test_meter.py tests/test_plugin.py \
    tests/test_gpu_path.py tests/test_scenarios.py -m cuda -q -p no:cacheprovider

echo "== quick sweep on the GPU (profiler cross-check in its own process)"
"$PYTHON" -m pytest bench/ --benchmark-only --kv-preset quick --kv-device cuda --kv-analyze -q \
    -p no:cacheprovider "$@"

echo "== the same sweep without the cross-check"
"$PYTHON" -m pytest bench/ --benchmark-only --kv-preset quick --kv-device cuda --kv-crosscheck off --kv-analyze \
    -q -p no:cacheprovider "$@"
runs=$(ls -d results/*-cuda-*/ | tail -2)
"$PYTHON" -m kvpages compare $runs
