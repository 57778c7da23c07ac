#!/usr/bin/env bash
# The GPU check, in one call (device time is short: keep it one call). At most 8 minutes on one H100/H200.
#
#     bash benchmarks/device_check.sh              # on a GPU machine; logs under $OUT (default /tmp/device_check)
#     bash benchmarks/device_check.sh --dry-run    # the same code on the CPU with tiny sizes (a few minutes)
#
# GPU_CHECK_SECONDS (default 460) is the whole check's budget in seconds, shared out between the sections;
# each runs in a process of its own under `timeout` and checks the same deadline before each row, so a
# slow section cannot eat the others' time (benchmarks/device_sections.py holds them):
# 1. the CUDA-only tests (the caching-allocator model against the real allocator, the forecast's allocator
#    peak against max_memory_allocated, remat under inductor, the callback on one GPU and under FSDP);
# 2. the real-model zoo (tests/zoo) in Trainer.fit with MemPlanCallback() at its defaults (inductor on CUDA):
#    plan, decision and compile seconds, step time with and without the callback; per epoch the prediction
#    against the callback's measurement, max_memory_allocated and memory_reserved;
# 3. plans on a Llama-shaped transformer (Llama 3.2 1B's shapes, bf16, random weights): no plan, every block
#    checkpointed, torch's budget alone, auto: peak, max allocated, reserved, step time; auto's share of full
#    checkpointing's saving and of its slowdown;
# 4. forecasts that allocate nothing: section 3's model on the meta device forecast for this GPU's named
#    target (made beside section 3: it needs no GPU), against section 3's real run, error in %;
# 5. the batch-size planner: MemPlanCallback(batch_size="max") against Lightning's BatchSizeFinder on a zoo
#    Llama, the device capped at 512 MiB (set_per_process_memory_fraction: the finder's OOMs are CUDA's own):
#    trial steps, search seconds, batch chosen, a fit's max_memory_reserved at that batch against the cap;
# then one summary table, each figure against its target, ending `sections run: K of 5`.
# Everything printed is also in $OUT/device_check.txt, each section's part in $OUT/section_<n>.txt and its
# figures in $OUT/section_<n>.json; the CUDA tests' log in $OUT/pytest_cuda.txt.
set -u
export PYTHONPATH=.
OUT=${OUT:-/tmp/device_check}
mkdir -p "$OUT"
PY=${PYTHON:-python}
DRY=""
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY=--dry-run ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "device_check.sh: unknown argument '$arg' (expected --dry-run)" >&2; exit 2 ;;
    esac
done
if [ -n "$DRY" ]; then
    TOTAL=${GPU_CHECK_SECONDS:-540}
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # two processes share the CPU in sections 3 and 4
else
    TOTAL=${GPU_CHECK_SECONDS:-460}
fi
# shares of TOTAL (seconds): sections 3 and 4 run side by side; the rest one after another. Section 5
# is one comparison that cannot stop halfway (about 1.5 minutes on a quiet 2-core CPU in a dry run, 3 beside
# the rest of the suite, where the other sections end well before their deadlines)
if [ -n "$DRY" ]; then  # deadlines, not the time taken: on a loaded 2-core CPU the zoo row needs its 22%
    S1=$((TOTAL * 24 / 100)); S2=$((TOTAL * 22 / 100)); S3=$((TOTAL * 49 / 100)); S4=$((TOTAL * 42 / 100))
    S5=$((TOTAL * 40 / 100))
else
    S1=$((TOTAL * 20 / 100)); S2=$((TOTAL * 17 / 100)); S3=$((TOTAL * 40 / 100)); S4=$((TOTAL * 34 / 100))
    S5=$((TOTAL * 18 / 100))
fi

section() {  # section NAME SECONDS: one section under its own deadline
    local name=$1 limit=$2
    timeout -k 10 "$limit" "$PY" benchmarks/device_sections.py "$name" --out "$OUT" --seconds "$limit" $DRY
    local rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "device_check: section '$name' stopped by its deadline ($limit s); it keeps what it wrote"
    elif [ "$rc" -ne 0 ]; then
        echo "device_check: section '$name' exited with code $rc"
    fi
}

check() {
    local t0=$SECONDS
    echo "device_check: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), OUT=$OUT, budget ${TOTAL} s${DRY:+ (dry run on the CPU)}"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$OUT/gpu.txt"
    else
        echo "nvidia-smi: not found" | tee "$OUT/gpu.txt"
    fi
    section tests "$S1" 2>&1 | tee "$OUT/section_1.txt"
    section zoo "$S2" 2>&1 | tee "$OUT/section_2.txt"
    section estimate "$S4" >"$OUT/section_4.txt" 2>&1 &  # allocates nothing: beside section 3
    local estimate=$!
    section plans "$S3" 2>&1 | tee "$OUT/section_3.txt"
    wait "$estimate"
    cat "$OUT/section_4.txt"
    "$PY" benchmarks/device_sections.py compare --out "$OUT" $DRY 2>&1 | tee -a "$OUT/section_4.txt"
    section batch "$S5" 2>&1 | tee "$OUT/section_5.txt"
    "$PY" benchmarks/device_sections.py summary --out "$OUT" --elapsed $((SECONDS - t0)) $DRY 2>&1 \
        | tee "$OUT/summary.txt"
}

check 2>&1 | tee "$OUT/device_check.txt"
exit "${PIPESTATUS[0]}"
