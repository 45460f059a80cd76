#!/usr/bin/env bash
# Issue 43's checks on a GPU machine, in one go: the CUDA tests, the step-time table, whether
# turns cost anything by themselves, and a profile of one bf16 GPT-85M node's steady steps
# beside the plain loop's (what the engine adds to a step). Run from the repository's root:
#
#     bash benchmarks/gpu_checks.sh [OUT_DIR]
#
# Each stage has its own time limit, so one that hangs leaves the others their time; what
# each printed is kept in OUT_DIR (default gpu_checks): tests.log (the machine first),
# bench.log, bench_variants.log (the bf16 case with the worker a thread of the benchmark's
# process, not forked; then with --offload), stacked.log (the bf16 and tiny64 cases with
# --stack-replicas), turns.log, profile.log and profile/. Needs simpy and greenlet importable
# (a GPU image may need them carried as wheels). The limits add up to 580 s: one device call
# of 600 s.
set -u
out=${1:-gpu_checks}
mkdir -p "$out/profile"
rm -f "$out"/*.log
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-python3}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $python -c "import torch, simpy, greenlet; print('torch', torch.__version__, 'simpy',
simpy.__version__, 'greenlet', greenlet.__version__)"; nproc; } 2>&1 | tee "$out/tests.log"

stage() {  # stage SECONDS LOG COMMAND...: run it under a limit, its output kept in LOG
  local limit=$1 log=$2; shift 2
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | grep -v '^USDT:' | tee -a "$log"
  echo "[$log: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s]" | tee -a "$log"
}

stage "${TESTS_SECONDS:-80}" "$out/tests.log" $python -m pytest -q -p no:cacheprovider \
  -o addopts= tests/test_gpu.py tests/test_placement.py
stage "${BENCH_SECONDS:-280}" "$out/bench.log" $python benchmarks/gpu_step_time.py --measured \
  ${BENCH_ARGS:-}
stage "${IN_PROCESS_SECONDS:-40}" "$out/bench_variants.log" $python benchmarks/gpu_step_time.py \
  --cases gpt85m-bf16 --no-plain --field in_process=true
stage "${OFFLOAD_SECONDS:-40}" "$out/bench_variants.log" $python benchmarks/gpu_step_time.py \
  --cases gpt85m-bf16 --no-plain --field offload=true
stage "${STACKED_SECONDS:-60}" "$out/stacked.log" $python benchmarks/gpu_step_time.py \
  --cases gpt85m-bf16,tiny64 --no-plain --field stack_replicas=true
stage "${TURNS_SECONDS:-40}" "$out/turns.log" $python benchmarks/gpu_turns.py
stage "${PROFILE_SECONDS:-40}" "$out/profile.log" $python benchmarks/gpu_profile.py \
  --case one-node --out "$out/profile"
