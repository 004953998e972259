#!/bin/sh
# Regenerate constraints.txt (the repository's root): resolve pyproject.toml's dependencies
# and its `dev` extra afresh from PyPI, in a throwaway virtualenv, and pin every package that
# installed. The image installs under these pins (deploy/Dockerfile), so two builds a week
# apart get the same packages; run this to move them on, then rebuild and test.
#
#   sh deploy/constraints.sh          (PYTHON=python3.11 to pick the interpreter: use the
#                                      image's Python, 3.11, as markers depend on it)
set -eu
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
venv="$(mktemp -d)"
trap 'rm -rf "$venv"' EXIT
"$python" -m venv "$venv"
"$venv/bin/python" - > "$venv/requirements.txt" <<'PY'
import tomllib

with open("pyproject.toml", "rb") as file:
    project = tomllib.load(file)["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["dev"]))
PY
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$venv/requirements.txt"
{
    echo "# Pins for pip install -c constraints.txt, from a resolved install of pyproject.toml's"
    echo "# dependencies and its dev extra on Python $("$venv/bin/python" -c 'import sys; print(*sys.version_info[:2], sep=".")')."
    echo "# Regenerate with: sh deploy/constraints.sh (do not edit by hand)."
    "$venv/bin/python" -m pip freeze --disable-pip-version-check
} > constraints.txt.new
mv constraints.txt.new constraints.txt
