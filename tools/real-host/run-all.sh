#!/usr/bin/env bash
# The device run for issue 40: check.sh for the change (`after`) under the host's pluggy and under the
# other pluggy the package allows, and for the baseline (`before`) under the host's, each log in $OUT.
#
#   tools/real-host/run-all.sh WHEELS   # WHEELS/{after,before,pluggy-1.6.0,pluggy-1.7.0}/*.whl
set -u
wheels=${1:?usage: run-all.sh WHEELS}
out=${OUT:-/tmp/fd-real-host-out}
mkdir -p "$out"
here=$(dirname "$0")
nvidia-smi -L > "$out/host.log" 2>&1; ls -l /dev/nvidia* >> "$out/host.log" 2>&1
for pluggy in 1.6.0 1.7.0; do
    target=/tmp/fd-pluggy-$pluggy
    python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target "$target" "$wheels"/pluggy-$pluggy/*.whl
    PYTHONPATH=$target "$here/check.sh" "$wheels/after" "after-pluggy-$pluggy" > "$out/after-pluggy-$pluggy.log" 2>&1
done
"$here/check.sh" "$wheels/before" "before-host-pluggy" > "$out/before.log" 2>&1
for log in "$out"/*.log; do
    echo "#### $(basename "$log")"
    grep -E '^## ' "$log"
    grep -E '^(== |-> exit )' "$log" | paste - - | sed 's/\t/  /' | cut -c1-160
done
