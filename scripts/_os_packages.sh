# Sourced by scripts/test: the OS packages some tests need. os_packages WHY PATH:PACKAGE...
# installs each PACKAGE whose PATH is missing, from the OS packages with apt-get (the package
# lists are refreshed only if a first install fails). Without root or apt-get it says what to
# install; the tests that need them then fail (none skips).
os_packages() {
  local why="$1" missing=() pair
  shift
  for pair in "$@"; do
    [ -x "${pair%%:*}" ] || missing+=("${pair##*:}")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing ${missing[*]} for $why" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${missing[@]}" >/dev/null \
      || { apt-get update -q >/dev/null && apt-get install -y -q "${missing[@]}" >/dev/null; } \
      || echo "could not install ${missing[*]}: $why will fail" >&2
  else
    echo "$why needs ${missing[*]}: apt-get install ${missing[*]} (as root)" >&2
  fi
}
