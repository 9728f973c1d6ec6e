#!/usr/bin/env bash
# One call on a lent GPU machine (issue #30), from the project root:
#   bash benchmarks/gpu_session.sh
# 1. installs the wheels in .whl/ if there are any (benchmarks/fetch_gpu_wheels.sh fetches them
#    beforehand, on a machine with the package registries: the GPU machine has no network, and
#    its image lacked pydantic, which typer 0.29 needs);
# 2. the GPU tests (benchmarks/gpu_tests.sh; ALL=1 adds the suite with the GPU visible);
# 3. the GPU check (benchmarks/gpu_check.sh: the table of issue #30's figures).
# Everything lands under OUT (default /tmp/gpu-session; the device tool's $OUT brings it back):
# tests/ (the pytest logs), check/ (gpu_check.md, .json, .log, the profile tables) and
# session.txt (each part's exit code and time). SKIP=tests or SKIP=check leaves a part out.
# Settings for the parts (PY, WORKERS, DEV, ONLY, ...) pass through the environment; TIMM_SCRIPTS
# defaults to .whl/timm-scripts where that folder holds timm's train.py (staged beforehand: the
# timm wheel lacks the scripts).
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
OUT=${OUT:-/tmp/gpu-session}
PY=${PY:-python3}
SKIP=${SKIP:-}
mkdir -p "$OUT"
summary=$OUT/session.txt
: > "$summary"
part() { # NAME CMD...: run a part, record its exit code and seconds
  local name=$1 started=$SECONDS rc
  shift
  "$@"
  rc=$?
  echo "$name rc=$rc $(( SECONDS - started )) s" | tee -a "$summary"
  return 0
}
cd "$ROOT" || exit 1
if [ -z "${TIMM_SCRIPTS:-}" ] && [ -f "$ROOT/.whl/timm-scripts/train.py" ]; then
  export TIMM_SCRIPTS=$ROOT/.whl/timm-scripts
fi
wheels=("$ROOT"/.whl/*.whl)
if [ -e "${wheels[0]}" ]; then
  part wheels "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade "${wheels[@]}"
fi
[ "$SKIP" = tests ] || part tests env OUT="$OUT/tests" PY="$PY" bash "$HERE/gpu_tests.sh"
[ "$SKIP" = check ] || part check env OUT="$OUT/check" PY="$PY" bash "$HERE/gpu_check.sh"
cat "$summary"
