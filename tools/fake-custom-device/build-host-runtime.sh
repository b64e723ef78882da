#!/usr/bin/env bash
# Build the fake vendor host runtime (pinned host allocators, malloc-backed).
#   usage: tools/fake-custom-device/build-host-runtime.sh OUTDIR
# Writes OUTDIR/libcudart.so (Iluvatar's cudaHostAlloc/cudaFreeHost) and
# OUTDIR/libmcruntime.so (MetaX's mcMallocHost/mcFreeHost) from one source and
# prints both paths. Put OUTDIR on LD_LIBRARY_PATH before the process starts.
# Keep OUTDIR apart from CUSTOM_DEVICE_ROOT: Paddle loads every .so there.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

die() {
    echo "build-host-runtime.sh: $*" >&2
    exit 2
}

[[ $# -eq 1 ]] || die "expected 1 argument (OUTDIR), got $#; run: $0 /tmp/fake-host-runtime"
outdir="$1"

command -v g++ >/dev/null 2>&1 \
    || die "g++ not found on PATH: a C++17 compiler is required; install it (e.g. apt-get install g++)"

mkdir -p "$outdir" || die "cannot create OUTDIR '$outdir'; pick a writable directory"
outdir="$(cd "$outdir" && pwd)"

for name in libcudart.so libmcruntime.so; do
    g++ -std=c++17 -O2 -fPIC -shared -Wall \
        "$here/fake_host_runtime.cc" -o "$outdir/$name" \
        || die "g++ failed to build $outdir/$name (see the compiler output above)"
done

echo "$outdir/libcudart.so"
echo "$outdir/libmcruntime.so"
