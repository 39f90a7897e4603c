#!/usr/bin/env bash
# deploy/ checked without a Docker engine or a Kubernetes cluster:
#  - compose: `docker compose config` when the compose plugin is there,
#    else Debian's docker-compose (`config` reads no engine either);
#  - systemd: `systemd-analyze verify` of every unit (no output allowed)
#    and `systemd-analyze security --offline` of the services;
#  - k8s, the Dockerfile, and the keylane flags every file uses:
#    check_deploy.py beside this file.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=${KEYLANE_SOURCE_DIR:-$(cd "$HERE/../.." && pwd)}
BIN=${KEYLANE_BIN:-$SRC/build/bin/keylane}
passed=0 failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
bad() { echo "FAILED: $*"; failed=$((failed + 1)); }

T=$(mktemp -d /tmp/keylane-deploy-XXXXXX)
trap 'rm -rf "$T"' EXIT

# ---- compose
COMPOSE=$SRC/deploy/compose/compose.yaml
if docker compose version >/dev/null 2>&1; then
  tool="docker compose"
else
  tool=docker-compose
fi
if $tool -f "$COMPOSE" config -q 2>"$T/compose.err"; then
  ok "compose: $tool config accepts deploy/compose/compose.yaml"
else
  bad "compose: $tool config: $(head -c 600 "$T/compose.err")"
fi

# ---- systemd: verify the units as installed, with the binary of this build
# in place of /usr/bin/keylane, which verify wants to exist, and the
# environment files optional (they live in /etc on a real host).
mkdir -p "$T/units"
for f in "$SRC"/deploy/systemd/*.service "$SRC"/deploy/systemd/*.target; do
  sed -e "s|/usr/bin/keylane|$BIN|" -e 's|^EnvironmentFile=/|EnvironmentFile=-/|' "$f" >"$T/units/$(basename "$f")"
done
# A template is verified through an instance.
for t in "$T"/units/*@.service; do cp "$t" "${t%@.service}@1.service"; done
units=()
for u in "$T"/units/*; do [[ $u == *@.service ]] || units+=("$u"); done
if out=$(cd "$T/units" && systemd-analyze verify --man=no "${units[@]}" 2>&1) && [ -z "$out" ]; then
  ok "systemd: systemd-analyze verify passes ${#units[@]} units with no warning"
else
  bad "systemd: systemd-analyze verify: $out"
fi
for u in "$T"/units/*.service; do
  [[ $u == *@.service ]] && continue
  name=$(basename "$u")
  level=$(systemd-analyze security --offline=yes "$u" 2>/dev/null |
    sed -n 's/.*Overall exposure level for .*: \([0-9.]*\) .*/\1/p')
  # 0 (locked down) .. 10 (unprotected); systemd calls up to 2.0 "OK".
  if [ -n "$level" ] && awk -v l="$level" 'BEGIN { exit !(l <= 2.0) }'; then
    ok "systemd: $name exposure $level (systemd-analyze security, OK is <= 2.0)"
  else
    bad "systemd: $name exposure '${level}', want <= 2.0"
  fi
done

# ---- k8s, the Dockerfile, flags: check_deploy.py's lines count, and so
# does its exit status, so that a checker that dies early (a missing
# module, a traceback) fails the test instead of passing with fewer checks.
status=0
/usr/bin/python3 "$HERE/check_deploy.py" "$SRC" "$BIN" >"$T/check.out" 2>&1 ||
  status=$?
while IFS= read -r line; do
  case $line in
    ok:*) passed=$((passed + 1)) ;;
    FAILED:*) failed=$((failed + 1)) ;;
  esac
  echo "$line"
done <"$T/check.out"
if [ "$status" != 0 ]; then
  bad "check_deploy.py exited with status $status (its output is above)"
fi

echo "deploy: $passed passed, $failed failed"
[ "$failed" = 0 ]
