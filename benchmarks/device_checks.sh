#!/usr/bin/env bash
# The checkpoint store's and the strategies' checks on a CUDA GPU, in one run of a few minutes: what a GPU machine
# lent for a short while (the device tool's `run`) is for. From the repository root:
#   make device-kit                        # here: .whl/, what that machine's python3 lacks (it has torch)
#   bash benchmarks/device_checks.sh       # there, carrying .whl; DEVICE_PYTHON=3.11 make device-kit to try it
#                                          # here first, with DEVICE_CHECKS_CPU=1 (the CPU half of each check)
# Each check has its own time limit, so one that hangs leaves the others' lines; everything printed also goes to
# $OUT/device_checks.txt where OUT is set.
set -uo pipefail
out=${OUT:-$(mktemp -d)}
site=$(mktemp -d)
python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl || exit 1
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 TP_HOME="$(mktemp -d)" TP_TEAMS="$PWD/tests/fixtures/teams.yaml"
cpu=${DEVICE_CHECKS_CPU:+--cpu}

check() {
    local limit=$1
    shift
    echo "== $*"
    timeout "$limit" "$@"
    echo "== exit $? after ${SECONDS}s"
}

{
    nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
    check 120 python3 -m pytest -q --noconftest -p no:cacheprovider tests/gpu
    [ -n "$cpu" ] || check 180 python3 benchmarks/checkpoint.py --cuda-only --size-gb 1
    check 300 python3 benchmarks/gpu_check.py ${cpu:+--cpu --steps 90}
} 2>&1 | tee "$out/device_checks.txt"
