#!/usr/bin/env bash
# Installs the Debian packages keylane builds and tests with. Idempotent:
# it does nothing when everything is present. As non-root it prints the
# command to run and stops.
#
#   install-deps.sh            build, plus clang for the sanitizers and fuzzer
#   install-deps.sh --test     that, plus what the test suites run
#   install-deps.sh --build    only what building needs (deploy/Dockerfile)
#   install-deps.sh --runtime  only the libraries the keylane binary links
#                              (the Dockerfile's runtime image)
#   ... --print                print the list instead of installing it
set -euo pipefail

# The libraries keylane links, by their Debian 12 package names; each -dev
# package below has its runtime library here. tests/deploy checks this list
# against the binary's DT_NEEDED entries.
runtime=(librdkafka1 libuv1 libmsgpackc2 liblmdb0 libpq5 libjansson4
  libhttp-parser2.9)
build=(build-essential cmake pkg-config
  librdkafka-dev libuv1-dev libmsgpack-dev libcmocka-dev liblmdb-dev
  libpq-dev libjansson-dev libhttp-parser-dev)
sanitizers=(clang libclang-rt-14-dev)
# Only the test suites need these: Java and Maven run the real Kafka of the
# kafka and fault suites (deploy/kafka), kcat and python3-venv the interop
# test, docker-compose (config only, no engine), systemd (systemd-analyze)
# and python3-yaml the checks of deploy/, util-linux (setpriv) the fault
# suite, clang-format-14 the format check (tests/format-check.sh),
# chromium the console's browser test (tests/mock/test_console_browser.sh).
tests=(kcat lmdb-utils postgresql curl wrk python3 python3-venv iproute2 openssl
  openjdk-17-jre-headless maven docker-compose systemd python3-yaml util-linux
  clang-format-14 chromium)

print=0 mode=default
for arg in "$@"; do
  case $arg in
    --print) print=1 ;;
    --test | --build | --runtime) mode=${arg#--} ;;
    *) echo "install-deps.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
case $mode in
  default) packages=("${build[@]}" "${sanitizers[@]}") ;;
  test) packages=("${build[@]}" "${sanitizers[@]}" "${tests[@]}") ;;
  build) packages=("${build[@]}") ;;
  runtime) packages=("${runtime[@]}") ;;
esac
if [ $print = 1 ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  grep -q 'install ok installed' <(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) || missing+=("$p")
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
