#!/usr/bin/env bash
# The GPU checks of the compiled learner (one H100 with 16 cores), in under 8 minutes:
#   1. the CUDA-graph steps against eager, a block of steps included
#      (tests/learning/test_train_step.py, CUDA only);
#   2. DQN's block of updates and SAC HalfCheetah's update: eager, compiled, compiled in
#      a CUDA graph (ms);
#   3. PPO on Pong (agent steps/s);
#   4. Pong's default run (IMPALA) with `--num_actors auto` (a CUDA learner: every core
#      but one acts; the Atari config's 2 actors are this 2-core VM's), for its agent
#      steps/s and returns as far as it gets.
# GPU_PARTS (default "parity learner_step ppo_pong impala_pong") picks the parts, for a
# rerun of some within what is left of a lending. The limits add up to 8 minutes; PPO's
# and IMPALA's compilations take 30-90 s of theirs (their steps wait for them).
# (SAC HalfCheetah end to end with CUDA graphs, 271-298 env steps/s on 2026-11-26, is
#  benchmarks/RESULTS.md's.)
# Each part has its own time limit, so that one failing leaves the others' figures.
# Python packages the machine lacks travel as wheels in .whl/ (the device tool's notes).
# Logs go to $OUT (default /tmp/gpu_checks).
set -u
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
fi
export PYTHONUNBUFFERED=1
python3 beast/native/build.py > /tmp/build.log 2>&1 || { echo "native build failed"; tail /tmp/build.log; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(), 'cpus', __import__('os').cpu_count())"

PARTS=${GPU_PARTS:-parity learner_step ppo_pong impala_pong}
part() {  # part NAME SECONDS COMMAND...: run it, keep its output, report how it ended
  local name=$1 seconds=$2
  shift 2
  [[ " $PARTS " == *" $name "* ]] || return 0
  local start=$SECONDS
  timeout -s INT --kill-after=20 "$seconds" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - start)) s"
  tail -n 12 "$OUT/$name.log"
}

BEAST_DEBUG_COMPILE=1 part parity 90 python3 -m pytest -q -p no:cacheprovider -n 0 \
  tests/learning/test_train_step.py -k cuda
part learner_step 130 python3 -m benchmarks.learner_step --device cuda \
  --only dqn,sac_halfcheetah --updates 100 --repeats 3
part ppo_pong 130 python3 monobeast.py --algo ppo --env PongNoFrameskip-v4 --compile on \
  --num_actors 8 --num_envs_per_actor 8 --batch_size 64 --total_steps 3000000 \
  --savedir "$OUT/runs" --xpid ppo
part impala_pong 130 python3 monobeast.py --env PongNoFrameskip-v4 --num_actors auto \
  --savedir "$OUT/runs" --xpid impala
for run in ppo impala; do
  cp "$OUT/runs/$run/logs.csv" "$OUT/${run}_logs.csv" 2>/dev/null
done
rm -rf "$OUT/runs"
