#!/usr/bin/env bash
# On a real accelerator host, what issue 40 asks of fd-platforms, command by command with its exit code.
#
#   tools/real-host/check.sh WHEELS [LABEL]
#
# WHEELS: a folder of fd-platforms' wheels (the core and the plugins: `pip wheel --no-deps . ./plugins/*
# ./examples/plugin-template -w WHEELS`). They are installed with no dependencies into a scratch folder
# first on PYTHONPATH, so the host's own pluggy, packaging and pytest are used (put another pluggy before
# it on PYTHONPATH to try that one) and nothing of the host's Python changes. Prints each command, its
# output and `-> exit N`; run it from the repository root (for the model config examples/qwen3-30b-a3b),
# and it runs each command from an empty folder, so the wheels' fd_platforms is the one imported.
set -u
wheels=${1:?usage: check.sh WHEELS [LABEL]}
label=${2:-fd-platforms}
site=$(mktemp -d "/tmp/fd-real-host-$label.XXXXXX")
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl || exit
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$site"
fd="python3 -m fd_platforms.cli"
model=$PWD/examples/qwen3-30b-a3b
cd "$(mktemp -d)" || exit  # not the checkout: `python3 -m` puts the working folder first on sys.path

step() {
    echo "== [$label] $*"
    env "$@" 2>&1
    echo "-> exit $?"
}

echo "## [$label] host: $(python3 -c 'import platform; print(platform.python_version())') python," \
    "pluggy $(python3 -c 'import pluggy; print(pluggy.__version__)')," \
    "paddle: $(python3 -c 'import paddle; print(paddle.__version__)' 2>&1 | tail -n 1)," \
    "nodes: $(ls /dev/nvidia[0-9]* 2>/dev/null | tr '\n' ' ')"
step $fd --version
step $fd list
step $fd list --json
step $fd plan --model $model
step python3 -c "import fd_platforms; fd_platforms.current_platform()"
step FD_PLATFORM=cpu $fd plan --model $model --device-memory 8GiB
step FD_PLATFORM=cpu $fd list
step CUDA_VISIBLE_DEVICES= $fd plan --model $model --device-memory 8GiB
step $fd check cuda
step $fd check --all
rm -rf "$site"
