#!/usr/bin/env bash
# The GPU check for issue 24, prepared to run once on a lent GPU machine (1 or 8 GPUs), ≤ 10 minutes:
# DIN's tables replicated (DDP) against sharded (TorchRec) over every GPU of the machine, one epoch of a
# synthetic log with a 1M-item catalog — samples/s, peak GPU memory of rank 0, SM and memory-bandwidth
# utilisation from NVML (`gpu_*` fields, with nvidia-ml-py). Three runs: replicated with Adam (the
# default), replicated with row-wise Adagrad (training/optim.py: the sharded run's optimizer, so the
# two differ only in where the tables live), sharded. One JSON line per run in $OUT/sharded.jsonl.
#
# Needs torch and dinrec's requirements in $PY (default python3); the sharded run needs TorchRec with
# FBGEMM's CUDA kernels (`pip install -e '.[sharded]'`) and is recorded as skipped, with the reason,
# where they cannot be imported (the lent H200 image has torch 2.11 and no TorchRec; fbgemm-gpu's
# ~500 MB wheel is over what a device call carries).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/dinrec-gpu}"; PY="${PY:-python3}"; mkdir -p "$OUT"
NGPU=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/nvidia-smi.csv"
DATA="$OUT/synthetic-1m"
if [[ ! -f "$DATA/events.jsonl" ]]; then
  mkdir -p "$DATA"
  "$PY" -c "
from dinrec.datasets.synthetic import SyntheticConfig, generate
from dinrec.events.schema import dumps_many
cfg = SyntheticConfig(n_users=100_000, n_items=1_000_000, n_categories=2_000, mean_events_per_user=20, seed=7)
open('$DATA/events.jsonl', 'w').write(dumps_many(list(generate(cfg).events())))
"
fi
COMMON=(DINREC_TRAIN_OBJECTIVE=pointwise DINREC_TRAIN_RECALL_EPOCHS=0 DINREC_TRAIN_RANKING_BLEND=false DINREC_TRAIN_PRECISION=bf16
        DINREC_TRAIN_BATCH_SIZE=$((4096 * NGPU)) DINREC_TRAIN_ATTENTION_ACTIVATION=prelu)
run() {  # name, extra environment...
  local name=$1; shift
  env "${COMMON[@]}" "$@" timeout 170 "$PY" -m dinrec.cli.main train --ranks gpus \
    --data "$DATA" --out "$OUT/$name" --epochs 1 --device cuda --no-progress \
    > "$OUT/$name.out" 2> "$OUT/$name.err"
  local rc=$?
  if [[ $rc -eq 0 ]]; then
    "$PY" -c "import json,sys; d=json.loads(open('$OUT/$name.out').read().strip().splitlines()[-1]); \
print(json.dumps({'run': '$name', 'gpus': $NGPU, **{k: v for k, v in d.items() if k.startswith(('samples_per_s', \
'gpu', 'peak', 'test_gauc', 'embeddings', 'world_size', 'precision'))}}))" | tee -a "$OUT/sharded.jsonl"
  else
    echo "{\"run\": \"$name\", \"rc\": $rc, \"why\": $(tail -c 600 "$OUT/$name.err" | "$PY" -c 'import json,sys; print(json.dumps(sys.stdin.read()))')}" \
      | tee -a "$OUT/sharded.jsonl"
  fi
}
run replicated-adam
run replicated-rowwise DINREC_TRAIN_EMBEDDING_OPTIMIZER=rowwise_adagrad DINREC_TRAIN_EMBEDDING_LR=0.05
if "$PY" -c "from dinrec.training.sharded import torchrec_missing as m; import sys; sys.exit(1 if m() else 0)"; then
  run sharded DINREC_TRAIN_EMBEDDINGS=sharded DINREC_TRAIN_EMBEDDING_LR=0.05
else
  "$PY" -c "import json; from dinrec.training.sharded import torchrec_missing as m; \
print(json.dumps({'run': 'sharded', 'skipped': m()}))" | tee -a "$OUT/sharded.jsonl"
fi
