# Sourced by scripts/*: create or refresh .venv with the project installed (extras in $EXTRAS).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.installed-$(cat "$ROOT/setup.cfg" "$ROOT/pyproject.toml" | sha1sum | cut -c1-12)-${EXTRAS:-none}"
if [ ! -f "$stamp" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  if [ -n "${EXTRAS:-}" ]; then
    "$VENV/bin/python" -m pip install -q -e "$ROOT[$EXTRAS]"
  else
    "$VENV/bin/python" -m pip install -q -e "$ROOT"
  fi

  touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
