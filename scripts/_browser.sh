# Sourced by scripts/test: the browser test needs Chromium and its driver from the OS packages
# (never a downloaded browser). Installs them with apt-get when missing; the package lists are
# refreshed only if a first install fails. Without root or apt-get it says what to install.
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing chromium and chromium-driver for the browser test" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium chromium-driver >/dev/null \
      || { apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null; } \
      || echo "could not install chromium chromium-driver: the browser test will fail" >&2
  else
    echo "the browser test needs /usr/bin/chromium and /usr/bin/chromedriver:" \
         "apt-get install chromium chromium-driver (as root)" >&2
  fi
fi
