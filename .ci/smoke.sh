#!/usr/bin/env bash
# Build the three wheels, install them into a fresh virtual environment with nothing from this
# repository on its path, and run the smoke test and `ragdefense demo` there (`make smoke`).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"
PYTHON="${PYTHON:-python3}"
BUILD_PY="${BUILD_PY:-.venv/bin/python}"
WORK="$REPO/build/smoke"
rm -rf "$WORK" && mkdir -p "$WORK/wheels"

echo "== building the three wheels"
for dist in core langchain_ragdefense llamaindex_ragdefense; do
  rm -rf "$dist/build"  # a stale build folder (a failed or manual build) would ship its files
  # the workspace venv's setuptools (no download); `make dist` builds them in isolation
  "$BUILD_PY" -m build --wheel --no-isolation --outdir "$WORK/wheels" "$dist" >"$WORK/build-$dist.log" 2>&1 \
    || { cat "$WORK/build-$dist.log"; exit 1; }
  rm -rf "$dist/build"
done
"$BUILD_PY" .ci/wheels.py "$WORK/wheels" | grep -v "^  "  # sizes; fails on a harness inside

echo "== installing them alone into a fresh virtual environment"
"$PYTHON" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
{
  "$VPY" -m pip install -q --upgrade pip
  # a CPU build, before the embeddings extra (TORCH_INDEX: see the Makefile)
  "$VPY" -m pip install -q torch==2.13.0 ${TORCH_INDEX:+--index-url "$TORCH_INDEX"}
  # the wheels by path: pip takes these files, never a same-named project from the index
  "$VPY" -m pip install -q \
    "$(ls "$WORK"/wheels/ragdefense-*.whl)[embeddings]" \
    "$WORK"/wheels/langchain_ragdefense-*.whl \
    "$WORK"/wheels/llama_index_postprocessor_ragdefense-*.whl
} >"$WORK/install.log" 2>&1 || { cat "$WORK/install.log"; exit 1; }
"$VPY" -m pip list --format=freeze 2>/dev/null | grep -i ragdefense

echo "== smoke test (run outside the repository)"
cd "$WORK"
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VPY" -I "$REPO/.ci/smoke.py" "$REPO"
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$WORK/venv/bin/ragdefense" demo >"$WORK/demo.log"
tail -3 "$WORK/demo.log"
grep -q "planted in context" "$WORK/demo.log" || { echo "ragdefense demo printed no summary"; exit 1; }
echo "== the three wheels install alone and work"
