#!/usr/bin/env bash
# The one prepared GPU script: train the `book` protocol (5 variants x 4 seeds) on one GPU
# (measured: about an hour on the full data, 2 minutes on the 1026-step slice; see the header
# of diagsink/configs/book.yaml) and record provenance. Run it from the repository root on the machine
# with the GPU:
#
#     DIAGSINK_DATA=/path/to/metr-la tools/gpu_reproduce.sh [OUT_DIR]
#
# Artifacts go to OUT_DIR/book/ (default book/results/book/). `diagsink reproduce` skips
# finished runs, so if the time cap below stops it, rerunning the script finishes the rest.
# Every run trains the fixed 12 epochs of diagsink/configs/book.yaml (no per-run time cap).
#
# Environment (defaults in brackets): PYTHON [python], PROTOCOL [book], SEEDS [4],
# DEVICE [cuda], CAP [570] seconds for the whole reproduce (a dry run on a CPU:
# PROTOCOL=quick SEEDS=1 DEVICE=cpu).
set -euo pipefail
OUT="${1:-book/results}"
PY="${PYTHON:-python}"
PROTOCOL="${PROTOCOL:-book}"
SEEDS="${SEEDS:-4}"
DEVICE="${DEVICE:-cuda}"
CAP="${CAP:-570}"
LOG="$OUT/$PROTOCOL/gpu_reproduce.log"
if [ -z "${DIAGSINK_DATA:-}" ]; then
  echo "error: set DIAGSINK_DATA to the METR-LA folder (metr-la.h5 + graph files); the GPU machine cannot download it." >&2
  exit 2
fi
mkdir -p "$OUT/$PROTOCOL"
{
  echo "== provenance =="
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  git rev-parse HEAD 2>/dev/null || echo "git: unknown"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: unavailable"
  "$PY" -c "import torch, diagsink; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available()); print('diagsink', diagsink.__version__)"
  "$PY" -m diagsink info || true
} 2>&1 | tee "$LOG"
start=$(date +%s)
# The default 570 s cap leaves time for start-up and copying the results back within 10 minutes.
timeout "$CAP" "$PY" -m diagsink reproduce --protocol "$PROTOCOL" --seeds "$SEEDS" --device "$DEVICE" --out "$OUT" \
  --no-progress 2>&1 | tee -a "$LOG" || \
  echo "reproduce stopped (status $?): rerun this script to finish the remaining runs" | tee -a "$LOG"
echo "wall time: $(( $(date +%s) - start )) s" | tee -a "$LOG"
ls -l "$OUT/$PROTOCOL" | tee -a "$LOG"
