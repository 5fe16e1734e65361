#!/usr/bin/env bash
# The GPU check for issue #3, prepared to run once on a lent device machine (one short script):
#   fp32 vs bf16 and L=20 vs L=50 on amazon-hin (MovieLens if absent); samples/s, peak memory,
#   SM and memory-bandwidth utilisation (NVML). Prints one JSON object per run to $OUT/gpu.jsonl.
# Usage on the device:  bash benchmarks/gpu_check.sh   (expects a venv at .venv or installs one)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/dinrec-gpu}"; mkdir -p "$OUT"
if [[ ! -x .venv/bin/dinrec ]]; then
  python3 -m venv .venv && .venv/bin/pip install -q -e '.[gpu]'
fi
DATA="${DINREC_SHARED_DATA:-../shared/data}/amazon-hin"
[[ -d "$DATA" ]] || DATA="${DINREC_SHARED_DATA:-../shared/data}/ml-100k"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/nvidia-smi.csv"
for precision in fp32 bf16; do
  for L in 20 50; do
    DINREC_TRAIN_PRECISION=$precision DINREC_TRAIN_BATCH_SIZE=4096 timeout 240 \
      .venv/bin/dinrec bench train --data "$DATA" --epochs 2 --seq-len "$L" --batch-size 4096 --device cuda --json \
      | tee -a "$OUT/gpu.jsonl"
  done
done
