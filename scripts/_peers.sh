# Sourced by scripts/bench when --peers is given: the peers' servers from Debian's packages
# (redis-server, beanstalkd, nats-server, rabbitmq-server), installed when missing. The
# packages' own services are not used: bench/peers.py starts its own servers on free
# 127.0.0.1 ports (RabbitMQ with its own epmd) and stops them.
missing=()
for pair in redis-server:redis-server beanstalkd:beanstalkd nats-server:nats-server \
            /usr/lib/rabbitmq/bin/rabbitmq-server:rabbitmq-server; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair##*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing the peers' servers: ${missing[*]} (apt-get)" >&2
  sudo_=()
  [ "$(id -u)" -eq 0 ] || sudo_=(sudo)
  "${sudo_[@]}" apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive "${sudo_[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
  if command -v ss >/dev/null && ss -ltn | grep -q ':4369 '; then
    echo "note: something listens on port 4369 (an epmd the rabbitmq-server package may have" \
         "started); the benchmark does not use it: stop it if it is not yours" >&2
  fi
fi
