# Sourced by scripts/example and scripts/test: makes .venv when missing (or when
# pyproject.toml changed since it was made) and activates it.
# torch is pinned to the CPU build first so that pip never pulls a multi-GB CUDA build on a
# machine without a GPU; set FLOPMETER_TORCH to choose another torch requirement.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
py="${PYTHON:-python3}"
stamp="$venv/.flopmeter-stamp"
want="$(cat "$root/pyproject.toml" | sha256sum | cut -c1-16)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "==> preparing $venv (first run takes a few minutes)" >&2
  "$py" -m venv "$venv"
  quiet() { "$@" 2>&1 | { grep -v -e "is ignored: it is neither" -e "^ *$" || true; } >&2; }
  quiet "$venv/bin/python" -m pip install -q --upgrade pip
  quiet "$venv/bin/python" -m pip install -q "${FLOPMETER_TORCH:-torch==2.13.0}"
  quiet "$venv/bin/python" -m pip install -q -e "$root[dev]"
  echo "$want" > "$stamp"
fi
# shellcheck disable=SC1091
source "$venv/bin/activate"
