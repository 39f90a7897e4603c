#!/usr/bin/env bash
# Installs the Debian packages keylane builds and tests with. Idempotent:
# it does nothing when everything is present. As non-root it prints the
# command to run and stops.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  librdkafka-dev libuv1-dev libmsgpack-dev libcmocka-dev liblmdb-dev
  libpq-dev libjansson-dev libhttp-parser-dev
  clang libclang-rt-14-dev
)
# Only the test suites need these: Java and Maven run the real Kafka of the
# kafka and fault suites (deploy/kafka), kcat and python3-venv the interop
# test, docker-compose (config only, no engine) and systemd
# (systemd-analyze) the checks of deploy/.
if [ "${1:-}" = "--test" ]; then
  packages+=(kcat lmdb-utils postgresql curl wrk python3 python3-venv iproute2
    openjdk-17-jre-headless maven docker-compose systemd util-linux)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "keylane needs these Debian packages: ${missing[*]}" >&2
  echo "run as root: apt-get update && apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
