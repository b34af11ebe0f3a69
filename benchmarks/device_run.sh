#!/usr/bin/env bash
# One call on the GPU machine: the library tests on the GPU, then python -m benchmarks.ops.
#   bash benchmarks/device_run.sh [benchmarks.ops args...]
# Expects Liger-Kernel's wheel in .whl/ (see benchmarks/README.md) and writes under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    timeout "${TEST_TIMEOUT:-240}" python3 -m pytest tests/library -q -x -p no:cacheprovider \
        -n "${TEST_WORKERS:-8}" 2>&1 | tail -40 | tee "$OUT/tests.log"
fi
python3 -m benchmarks.ops --out "$OUT/results" "$@" 2>&1 | tee "$OUT/bench.log"
tar -C "$OUT" -czf "$OUT/results.tgz" results && rm -rf "$OUT/results"
