#!/usr/bin/env bash
# The CUDA checks a session with a GPU machine runs, in one go (device time is short: keep it one call).
#
#     bash benchmarks/device_check.sh              # writes its logs to $OUT (default /tmp/device_check)
#
# 1. CUDA-only tests: the caching allocator model event by event against the real allocator, the
#    forecast's allocator peak against max_memory_allocated, remat under inductor, the callback on
#    one GPU and under FSDP.
# 2. benchmarks/gpu_check.py without the CPU solver section: the forecast table (allocated, requested,
#    reserved, a memory-history trace of each row) and the plans table (saving and slowdown of every
#    plan, and what `auto` chose).
set -u
export PYTHONPATH=.
OUT=${OUT:-/tmp/device_check}
mkdir -p "$OUT"
LIMIT=${GPU_CHECK_SECONDS:-300}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$OUT/gpu.txt"
timeout 200 python -m pytest -q -s -p no:cacheprovider --import-mode=importlib \
    tests/forecast/test_cuda_allocator.py tests/forecast/test_forecast.py tests/callback/test_cuda.py \
    -k "cuda or fsdp or remat_plan" 2>&1 | tail -40 | tee "$OUT/pytest_cuda.txt"
timeout $((LIMIT + 40)) python benchmarks/gpu_check.py --no-solvers --time-limit "$LIMIT" 2>&1 \
    | tee "$OUT/gpu_check.txt"
