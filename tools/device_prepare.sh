#!/usr/bin/env bash
# Prepare a run on a GPU machine without network access (tools/device_gpu.sh says what runs
# there). Run HERE, from the repository root:
#
#     DIAGSINK_DATA=/path/to/metr-la tools/device_prepare.sh
#
# It fills two git-ignored folders that travel with the tree to the GPU machine:
#   .whl/      wheels the GPU machine lacks: PyTables and its compiled dependencies for its
#              Python 3.12 (it has torch, numpy, pandas, pyyaml, tqdm, matplotlib already);
#   .devdata/  the METR-LA files (every speed file DIAGSINK_DATA has: metr-la.h5, the
#              1026-step slice, the 29-sensor full-length file) and COMMIT, the commit of this tree (the copy there has no .git).
# Everything that travels must stay under 64 MiB; the script checks it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${DIAGSINK_DATA:?set DIAGSINK_DATA to the METR-LA folder (speed file + graph files)}
rm -rf .whl .devdata
mkdir -p .whl .devdata/metr-la
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
for pkg in tables==3.11.1 blosc2==3.12.2 numexpr==2.14.2 ndindex==1.10.1 platformdirs; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl "$pkg" 2>&1 | grep -v "is ignored" || true
done
[ "$(ls .whl/*.whl | wc -l)" -eq 5 ] || { echo "error: expected 5 wheels in .whl, got: $(ls .whl)" >&2; exit 1; }
speeds=()
for name in metr-la.h5 metr-la_first1026steps.h5 metr-la_29sensors_allsteps.h5; do
  [ -f "$DATA/$name" ] && speeds+=("$DATA/$name")
done
[ ${#speeds[@]} -gt 0 ] || { echo "error: no metr-la speed file (.h5) in $DATA" >&2; exit 1; }
cp "${speeds[@]}" "$DATA/graph_sensor_ids.txt" "$DATA/graph_sensor_locations.csv" "$DATA/adj_mx.pkl" .devdata/metr-la/
"$PY" -c "from diagsink.engine.provenance import git_commit; print(git_commit())" > .devdata/COMMIT  # what artifacts record
case "$(cat .devdata/COMMIT)" in
  *+dirty|unknown) echo "error: the tree has uncommitted changes (or no commit): commit first, so the GPU artifacts name the code that made them" >&2; exit 1 ;;
esac
tree_kib=$(git ls-files -z | du -c --files0-from=- -k | tail -1 | cut -f1)
carried_kib=$(du -sk .whl .devdata | awk '{s += $1} END {print s}')
total_mib=$(( (tree_kib + carried_kib) / 1024 ))
echo "prepared: $(ls .whl | tr '\n' ' ')"
echo "data: $(basename "$speed"); commit $(cat .devdata/COMMIT); about ${total_mib} MiB travel (limit 64)"
if [ "$total_mib" -ge 60 ]; then
  echo "error: about ${total_mib} MiB would travel; use the 1026-step slice or leave figures out" >&2
  exit 1
fi
echo 'next: copy the tree with .whl and .devdata to the GPU machine and run `bash tools/device_gpu.sh reproduce` there'
