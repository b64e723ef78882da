#!/usr/bin/env bash
# Build the fake Paddle custom-device runtime for one device type.
#   usage: tools/fake-custom-device/build.sh DEVICE_TYPE OUTDIR
# Writes OUTDIR/libfake_<DEVICE_TYPE>.so and prints its path. Point
# CUSTOM_DEVICE_ROOT at OUTDIR before importing paddle to load it.
# PYTHON selects the interpreter whose paddle headers are used (default python3).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"

die() {
    echo "build.sh: $*" >&2
    exit 2
}

[[ $# -eq 2 ]] || die "expected 2 arguments (DEVICE_TYPE OUTDIR), got $#; run: $0 iluvatar_gpu /tmp/fake-devices"
device_type="$1"
outdir="$2"

[[ "$device_type" =~ ^[a-z][a-z0-9_]*$ ]] \
    || die "bad DEVICE_TYPE '$device_type': allowed pattern is ^[a-z][a-z0-9_]*\$ (lowercase letter, then lowercase letters, digits or _); e.g. iluvatar_gpu"

command -v g++ >/dev/null 2>&1 \
    || die "g++ not found on PATH: a C++17 compiler is required; install it (e.g. apt-get install g++)"

command -v "$python" >/dev/null 2>&1 \
    || die "python interpreter '$python' not found; set PYTHON to the interpreter that has paddle installed"

# Locate paddle without importing it (an import takes about a second).
paddle_dir="$("$python" - <<'EOF'
import importlib.util
spec = importlib.util.find_spec("paddle")
if spec is not None and spec.submodule_search_locations:
    print(list(spec.submodule_search_locations)[0])
EOF
)" || die "'$python' failed while looking for paddle; set PYTHON to a working interpreter"
[[ -n "$paddle_dir" ]] \
    || die "paddle is not installed for '$python'; install paddlepaddle or set PYTHON to the interpreter that has it"

include="$paddle_dir/include"
for header in paddle/phi/backends/device_ext.h paddle/phi/backends/device_base.h; do
    [[ -f "$include/$header" ]] \
        || die "header $include/$header is missing: this paddle build has no custom-device headers; install a paddlepaddle wheel that ships paddle/include"
done

mkdir -p "$outdir" || die "cannot create OUTDIR '$outdir'; pick a writable directory"
lib="$(cd "$outdir" && pwd)/libfake_${device_type}.so"

g++ -std=c++17 -O2 -fPIC -shared -Wall \
    -I"$include" \
    -DFAKE_DEVICE_TYPE="\"$device_type\"" \
    "$here/fake_runtime.cc" -o "$lib"

echo "$lib"
