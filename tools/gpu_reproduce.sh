#!/usr/bin/env bash
# Train the book's full-length protocols on one GPU in one call, offline, and record provenance.
# Run it from the repository root on the machine with the GPU (no network needed: the data
# folder and an installed environment must be there):
#
#     DIAGSINK_DATA=/path/to/metr-la tools/gpu_reproduce.sh [OUT_DIR]
#
# Steps, in order (each `diagsink reproduce` skips finished runs and resumes an interrupted one,
# so rerunning the script after the time cap finishes the rest):
#   1. full29           5 variants x 4 seeds, the book model on all 34,272 steps of the
#                       29-sensor file (diagsink/configs/full29.yaml);
#   2. full29-released  (b) none, (d) dropout, (e) penalty x 4 seeds with the released graph layer;
#   3. diagsink/configs/custom-full29-x2.yaml, 4. diagsink/configs/custom-full29-released-x2.yaml
#                       the same two with twice the epochs (their twins on the results page);
#   5. paper            the paper's model size and schedule on the same 29-sensor file
#                       (--speed-file), 5 variants x PAPER_SEEDS seeds.
# After each step every finished run gets its sensitivity and test_by_day fields
# (`diagsink sensitivity --by-day`).
#
# Environment (defaults in brackets): PYTHON [python], DEVICE [cuda], SEEDS [4],
# PAPER_SEEDS [4], VARIANTS [all five], STEPS [the five above, in that order],
# SPEED_FILE [metr-la_29sensors_allsteps.h5], CAP [570] seconds for the whole script.
# A step may also be a protocol file (STEPS="my-protocol.yaml"); its runs go to
# OUT_DIR/<its protocol: name>/; a file whose name contains "released" trains (b), (d), (e)
# only, like full29-released. A dry run on a CPU, the same steps on a tiny protocol file
# (tests/test_gpu_script.py runs one of a single epoch of two batches):
#     DEVICE=cpu STEPS=custom-tiny.yaml SEEDS=1 VARIANTS=none tools/gpu_reproduce.sh /tmp/out
set -euo pipefail
OUT="${1:-book/results}"
PY="${PYTHON:-python}"
DEVICE="${DEVICE:-cuda}"
SEEDS="${SEEDS:-4}"
PAPER_SEEDS="${PAPER_SEEDS:-4}"
VARIANTS="${VARIANTS:-no_residual,none,mask,dropout,penalty}"
STEPS="${STEPS:-full29 full29-released diagsink/configs/custom-full29-x2.yaml diagsink/configs/custom-full29-released-x2.yaml paper}"
SPEED_FILE="${SPEED_FILE:-metr-la_29sensors_allsteps.h5}"
CAP="${CAP:-570}"
if [ -z "${DIAGSINK_DATA:-}" ]; then
  echo "error: set DIAGSINK_DATA to the METR-LA folder (speed file + graph files); this script does not download." >&2
  exit 2
fi
mkdir -p "$OUT"
LOG="$OUT/gpu_reproduce.log"
{
  echo "== provenance =="
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  git rev-parse HEAD 2>/dev/null || echo "git: ${DIAGSINK_GIT_COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: unavailable"
  "$PY" -c "import torch, diagsink; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available()); print('diagsink', diagsink.__version__)"
} 2>&1 | tee "$LOG"
start=$(date +%s)
left() { echo $(( CAP - ($(date +%s) - start) )); }

name_of() {  # the folder a step's runs go to: a protocol's name, or a protocol file's `protocol:`
  case "$1" in
    *.yaml | *.yml) "$PY" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["protocol"])' "$1" ;;
    *) echo "$1" ;;
  esac
}

step() {  # step PROTOCOL [reproduce options...]: train, then attach the sensitivity of every run
  local protocol=$1; shift
  if [ "$(left)" -le 10 ]; then echo "skip $protocol: the time cap is spent" | tee -a "$LOG"; return 0; fi
  echo "== $protocol ==" | tee -a "$LOG"
  timeout "$(left)" "$PY" -m diagsink reproduce --protocol "$protocol" --device "$DEVICE" --out "$OUT" \
    --no-progress "$@" 2>&1 | tee -a "$LOG" || \
    { echo "reproduce $protocol stopped (status $?): rerun this script to finish it" | tee -a "$LOG"; return 0; }
  local runs=("$OUT/$(name_of "$protocol")"/*_seed*.json)
  [ -e "${runs[0]}" ] && "$PY" -m diagsink sensitivity --by-day "${runs[@]}" 2>&1 | tee -a "$LOG"
  return 0
}

for s in $STEPS; do
  case "$s" in
    full29-released | *released*.yaml) step "$s" --seeds "$SEEDS" --variants none,dropout,penalty ;;
    paper) step paper --seeds "$PAPER_SEEDS" --variants "$VARIANTS" --speed-file "$SPEED_FILE" ;;
    *) step "$s" --seeds "$SEEDS" --variants "$VARIANTS" ;;
  esac
done
echo "wall time: $(( $(date +%s) - start )) s" | tee -a "$LOG"
