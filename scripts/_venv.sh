# Sourced by scripts/*: create or refresh .venv with the project installed (extras in $EXTRAS).
# Quiet: what venv and pip print (progress, deprecation notices, build output) goes to
# .venv/install.log, shown only when a step fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.installed-$(cat "$ROOT/setup.cfg" "$ROOT/pyproject.toml" | sha1sum | cut -c1-12)-${EXTRAS:-none}"
if [ ! -f "$stamp" ]; then
  install_log="$VENV/install.log"
  : >"$install_log"
  echo "installing the project${EXTRAS:+ with [$EXTRAS]} into .venv (log: .venv/install.log)"
  pip_quiet=(-q --disable-pip-version-check --no-input)
  "$VENV/bin/python" -m pip install "${pip_quiet[@]}" --upgrade pip >>"$install_log" 2>&1 || true
  if ! "$VENV/bin/python" -m pip install "${pip_quiet[@]}" -e "$ROOT${EXTRAS:+[$EXTRAS]}" \
      >>"$install_log" 2>&1; then
    echo "installing into $VENV failed; the end of $install_log:" >&2
    tail -n 40 "$install_log" >&2
    exit 1
  fi
  # matplotlib builds its font cache at its first import, running fc-list: done here, once,
  # so that no test (a unit test may start no process) is the first to import it.
  "$VENV/bin/python" -c "import matplotlib.font_manager" >>"$install_log" 2>&1 || true
  touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
