#!/usr/bin/env bash
# make gpu-check: on a CUDA machine, in one go (a few minutes):
#   1. the CUDA-marked tests (variants on CUDA, the meter against the CUDA profiler),
#   2. a `quick` sweep on the GPU, written as a run folder to results/ with charts and REPORT.md.
# Uses $PYTHON (default: python3). Works without installing kvpages: the plugin is then loaded by name.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu-check: torch sees no CUDA device ($("$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA build", torch.version.cuda)')); nothing to check" >&2
    exit 2
fi
if ! "$PYTHON" -c "import importlib.metadata as m; m.distribution('kvpages')" 2>/dev/null; then
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTEST_PLUGINS=kvpages.plugin
fi
"$PYTHON" -c "import torch; print('gpu-check on', torch.cuda.get_device_name(), 'torch', torch.__version__, 'CUDA', torch.version.cuda)"
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv || true

echo "== CUDA-marked tests (variants, inputs, meter vs profiler)"
"$PYTHON" -m pytest tests/test_variants.py tests/test_inputs.py tests/test_meter.py -m cuda -q -p no:cacheprovider

echo "== quick sweep on the GPU"
"$PYTHON" -m pytest bench/ --benchmark-only --kv-preset quick --kv-device cuda --kv-analyze -q -p no:cacheprovider "$@"
