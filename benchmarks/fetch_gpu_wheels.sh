#!/usr/bin/env bash
# The wheels the GPU machine's image lacked (2026-11-26: pydantic, which typer 0.29 needs) and
# the versions uv.lock pins for torchkit's own pure dependencies, downloaded into .whl/ for
# benchmarks/gpu_session.sh to install there (that machine has no network). Run here, where the
# package registries are reachable; .whl/ is git-ignored, so the device tool must `carry` it.
# They are installed with --no-deps: the list holds each one's dependencies too (uv.lock's),
# but for pytest, torch's and torchvision's, which the machine has.
#   bash benchmarks/fetch_gpu_wheels.sh        # PYVER (3.12): the GPU machine's Python
set -eu
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
PYVER=${PYVER:-3.12}
locked() { # the version uv.lock pins for a package
  awk -v name="$1" '$0 == "name = \"" name "\"" {getline; gsub(/version = |"/, ""); print; exit}' \
    "$ROOT/uv.lock"
}
specs=()
for name in typer rich torchinfo pydantic pydantic-core annotated-types typing-inspection \
            typing-extensions shellingham annotated-doc markdown-it-py mdurl pygments pytest-xdist \
            execnet; do
  version=$(locked "$name")
  [ -n "$version" ] && specs+=("$name==$version")
done
echo "fetching: ${specs[*]}"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d "$ROOT/.whl" "${specs[@]}"
ls "$ROOT/.whl"
