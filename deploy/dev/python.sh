#!/usr/bin/env bash
# Prepares the Python environment of the Python client's tests: a virtual environment at
# $AIRLOCK_CACHE/python (outside the clone; created once, its dependencies installed once per
# change of clients/python/pyproject.toml), then this clone's client installed into it (a
# second or two: no build isolation, no dependency resolution).
#
# Knobs: AIRLOCK_CACHE (default $HOME/.cache/airlock). Prints the interpreter's path.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=deploy/dev/env.sh
source "$here/env.sh"

venv="$AIRLOCK_CACHE/python"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
stamp="$venv/.deps-$(sha256sum "$root/clients/python/pyproject.toml" | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    "confluent-kafka>=2.6" "fastavro>=1.9" "mcp>=2.3" "uvicorn>=0.31" "langchain-core>=0.3" \
    "openai-agents>=0.2" "pytest>=7" "cryptography>=41" \
    "setuptools>=61" wheel >&2
  rm -f "$venv"/.deps-*
  touch "$stamp"
fi
# Built from a copy: setuptools writes build/ and *.egg-info beside the sources.
copy="$(mktemp -d)"
trap 'rm -rf "$copy"' EXIT
cp -r "$root/clients/python/." "$copy"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
  --no-build-isolation --force-reinstall "$copy" >&2
echo "$venv/bin/python"
