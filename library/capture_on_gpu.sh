#!/usr/bin/env bash
# One call on a CUDA machine (the device tool's H100): record which kernels the library's
# workloads launch, and how, and capture them (docs/writing-kernels.md, Shipped Triton
# binaries). Every other set (other Tritons, Pythons) is then made from the launch records on
# any machine, without a GPU: `make binaries`.
#   bash library/capture_on_gpu.sh
# Writes under $OUT: binaries.tgz (library/<repo>/binaries/ and binaries-launches.json, to unpack
# over the checkout) and cold_start/ (the cold, warm and seeded runs, after the capture).
set -uo pipefail
cd "$(dirname "$0")/.."
source .ci/gpu-env || exit 1
work=$(mktemp -d)
python3 -m benchmarks.cold_start --cases train,generate --keep-cache "$work/here" --out "$work/ignored" || exit 1
for gpu in a100 b200; do
    python3 -m benchmarks.cold_start --cases train,generate --keep-cache "$work/$gpu" \
        --compile-for "$gpu" --out "$work/ignored" || exit 1
done
python3 library/binaries.py capture "$work"/here/* "$work"/a100/* "$work"/b200/* || exit 1
python3 library/binaries.py list | tee "$OUT/binaries.txt"
tar -czf "$OUT/binaries.tgz" library/*/binaries library/*/binaries-launches.json
python3 -m benchmarks.cold_start --binaries --out "$OUT/cold_start" 2>&1 | tail -30
