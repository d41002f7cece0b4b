# Sourced by scripts/test: the gateway tests in a second language run a Node.js beanstalkd
# client and the AWS SDK for JavaScript v3 (tests/node, their versions pinned in
# package-lock.json), installed with npm from the registry when missing or when the lock file
# changed.
NODE_DIR="$ROOT/tests/node"
if command -v npm >/dev/null; then
  if [ ! -d "$NODE_DIR/node_modules" ] \
     || [ "$NODE_DIR/package-lock.json" -nt "$NODE_DIR/node_modules/.package-lock.json" ]; then
    echo "installing the Node.js clients for the gateway tests" >&2
    npm ci --prefix "$NODE_DIR" --no-audit --no-fund --silent \
      || echo "npm ci failed: the Node.js gateway test will fail" >&2
  fi
else
  echo "the Node.js gateway test needs node and npm (apt-get install nodejs npm)" >&2
fi
