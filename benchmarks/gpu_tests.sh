#!/usr/bin/env bash
# The suite on a machine with one CUDA GPU (issue #30), from this checkout, also where it is not
# installed (a machine whose python3 has torch and torchvision but not torchkit): the GPU tests
# (`pytest -m cuda`), then, with ALL=1, the whole suite with the GPU visible
# (TORCHKIT_TESTS_SEE_GPU=1: `--device auto` picks the GPU in every test that does not pin one).
#
#   bash benchmarks/gpu_tests.sh                  # the GPU tests
#   ALL=1 bash benchmarks/gpu_tests.sh            # and the suite with the GPU visible
#   CUDA=0 ALL=1 bash benchmarks/gpu_tests.sh     # the suite with the GPU visible alone
#
# Settings (environment): PY (python3), WORKERS (pytest-xdist workers: 8), OUT (where the logs
# go: /tmp/gpu-tests). Arguments (test files) replace `tests`. Where `import torchkit.cli`
# fails, a .pth file in PY's site-packages puts the checkout on the path of every Python the
# tests start (they set PYTHONPATH themselves), and a `torchkit` script beside PY runs it; both
# are removed at the end.
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
PY=${PY:-python3}
WORKERS=${WORKERS:-8}
OUT=${OUT:-/tmp/gpu-tests}
mkdir -p "$OUT"
cleanup=()
trap 'rm -f "${cleanup[@]}"' EXIT
if ! (cd / && "$PY" -c 'import torchkit.cli' 2>/dev/null); then
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$ROOT" > "$site/torchkit-checkout.pth" && cleanup+=("$site/torchkit-checkout.pth")
  script="$(dirname "$(command -v "$PY")")/torchkit"
  if [ ! -e "$script" ]; then
    printf '#!%s\nfrom torchkit.cli import main\nmain()\n' "$(command -v "$PY")" > "$script"
    chmod +x "$script" && cleanup+=("$script")
  fi
fi
cd "$ROOT" || exit 1
if ! preflight=$("$PY" -m torchkit --version 2>&1); then # e.g. a missing package: stop now
  echo "cannot run torchkit with $PY:" >&2
  echo "$preflight" | tail -3 >&2
  exit 2
fi
# Without a usable GPU every GPU test skips, and "31 skipped" would end this script with 0.
if ! gpu=$("$PY" -m torchkit env --require-cuda --format json 2>&1 > /dev/null); then
  echo "no usable CUDA GPU for $PY (the GPU tests would all be skipped):" >&2
  echo "$gpu" | tail -3 >&2
  exit 2
fi
export PYTHONUNBUFFERED=1 NO_COLOR=1
[ $# -eq 0 ] && set -- tests
rc=0
if [ "${CUDA:-1}" = 1 ]; then
  "$PY" -m pytest -m cuda -p no:cacheprovider -q -n "$WORKERS" -rfEs "$@" > "$OUT/cuda.log" 2>&1
  rc=$?
  [ "$rc" = 5 ] && rc=0 # no GPU test among the files given
  echo "pytest -m cuda: rc=$rc: $(tail -1 "$OUT/cuda.log")"
fi
if [ "${ALL:-0}" = 1 ]; then
  TORCHKIT_TESTS_SEE_GPU=1 "$PY" -m pytest -p no:cacheprovider -q -n "$WORKERS" -rfE "$@" \
    > "$OUT/see_gpu.log" 2>&1
  all=$?
  echo "the suite with the GPU visible: rc=$all: $(tail -1 "$OUT/see_gpu.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/see_gpu.log"
  [ "$rc" = 0 ] && rc=$all
fi
exit "$rc"
