#!/usr/bin/env bash
# Runs on a GPU machine without network access, from the repository root, after
# `tools/device_prepare.sh` has built `.whl` (the wheels) and `.devdata` (the data and the
# commit) here and both were copied there with the tree. OUT names the folder for the files
# to bring back. Modes:
#
#   bash tools/device_gpu.sh reproduce
#       runs tools/gpu_reproduce.sh (full29, full29-released and the paper's model size on the
#       29-sensor file, capped at CAP=540 s) and writes $OUT/results.tar.gz (one folder per
#       protocol with its artifacts, and the log). Finished runs are kept in
#       /tmp/diagsink-results, so a second `reproduce` on the same machine finishes the rest.
#   bash tools/device_gpu.sh bench
#       the training benchmark on the GPU, eager and under torch.compile:
#       $OUT/training_cuda.json, $OUT/training_cuda_compile.json and their printed output
#       $OUT/bench-*.txt, for benchmarks/results/.
#
# Back here: `tar -xzf results.tar.gz -C book/results`, check them with
# `pytest tests/test_artifacts.py tests/test_recompute.py`, and commit the protocol folders.
# A dry run on this machine's CPU (STEPS and the other settings are gpu_reproduce.sh's):
# `OUT=/tmp/out WHEELS=0 PYTHON=.venv/bin/python DEVICE=cpu STEPS=my-tiny.yaml SEEDS=1 \
# bash tools/device_gpu.sh reproduce`.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?OUT is set on the device machine: the folder whose files come back}"
mode="${1:-reproduce}"
PYTHON="${PYTHON:-python3}"
RESULTS=/tmp/diagsink-results
if [ "${WHEELS:-1}" = 1 ]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "error: installing the carried wheels failed (run tools/device_prepare.sh and carry .whl)" >&2; exit 3; }
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
[ -f .devdata/COMMIT ] || { echo "error: .devdata is missing (run tools/device_prepare.sh and carry .devdata)" >&2; exit 3; }
export PYTHONUNBUFFERED=1 DIAGSINK_QUICK=0 DIAGSINK_DATA="$PWD/.devdata/metr-la"
DIAGSINK_GIT_COMMIT="$(cat .devdata/COMMIT)"
# The copy there may hold a .git that is not this tree's; artifacts record .devdata/COMMIT only.
export DIAGSINK_GIT_COMMIT GIT_DIR=/nonexistent
DEVICE="${DEVICE:-cuda}"
"$PYTHON" - <<PY || exit 3
import torch, tables, diagsink
print("torch", torch.__version__, "tables", tables.__version__, "diagsink", diagsink.__version__)
if "$DEVICE" == "cuda":
    assert torch.cuda.is_available(), "no CUDA device visible"
    print(torch.cuda.get_device_name(0))
PY
case "$mode" in
  reproduce)
    mkdir -p "$RESULTS"
    PYTHON="$PYTHON" DEVICE="$DEVICE" CAP="${CAP:-540}" bash tools/gpu_reproduce.sh "$RESULTS"
    tar -czf "$OUT/results.tar.gz" -C "$RESULTS" .
    echo "packed: $(tar -tzf "$OUT/results.tar.gz" | grep -c '\.json$') artifacts in $OUT/results.tar.gz"
    ;;
  bench)
    timeout 240 "$PYTHON" benchmarks/training.py --device "$DEVICE" --steps 9 \
      --out "$OUT/training_$DEVICE.json" > "$OUT/bench-training-$DEVICE.txt" 2>&1
    echo "training benchmark: status $?"
    timeout 300 "$PYTHON" benchmarks/training.py --device "$DEVICE" --steps 9 --compile \
      --out "$OUT/training_${DEVICE}_compile.json" > "$OUT/bench-training-$DEVICE-compile.txt" 2>&1
    echo "training benchmark, torch.compile: status $?"
    tail -n 5 "$OUT"/bench-*.txt
    ;;
  *)
    echo "error: mode '$mode' is not known; use reproduce or bench" >&2
    exit 2
    ;;
esac
