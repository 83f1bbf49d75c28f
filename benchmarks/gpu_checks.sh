#!/usr/bin/env bash
# The GPU checks (one H100 with 16 cores), in at most 8 minutes from the script's start:
#   pong18  Pong's default run (IMPALA) with `--num_actors auto` (a CUDA learner: every
#           core but one acts; the Atari config's 2 actors are the 2-core VM's) to a mean
#           of +18 over the last 100 episodes, through benchmarks/atari.py: wall-clock and
#           agent steps from launch to +18 (issue 41's goal: 5 minutes), steady agent
#           steps/s after 60 s (10.5k on 2026-11-28; env-only stepping on 16 threads is
#           about 35k), peak RSS of every process; a budget of 300 s from launch,
#           stopped at +18;
#   sac_halfcheetah  SAC HalfCheetah-v5 end to end with its shipped config, compiled (a
#           CUDA graph) and learning from step 5,000 (the flags of its 271-298 env
#           steps/s of 2026-11-26; LeanRL reports 725 on an H100), through the same
#           benchmark for its steady env steps/s after 55 s (no score: threshold inf);
#           needs MuJoCo (a wheel in .whl/ where the machine lacks it);
#   parity  the CUDA-graph steps against eager, a block of steps included (the CUDA
#           tests of tests/learning), in what time is left;
# and, by name only: learner_step (DQN's block of updates and SAC HalfCheetah's update:
# eager, compiled, in a CUDA graph, ms), ppo_pong (PPO on Pong, agent steps/s),
# impala_pong (Pong's default run with --num_actors auto for 130 s, no benchmark).
# GPU_PARTS (default "pong18 sac_halfcheetah parity") picks the parts; they run in the
# order above.
# Each part has its own time limit, cut to what is left of the 8 minutes (a part with
# under 20 s left is skipped and says so), so that one failing leaves the others' figures.
# Python packages the machine lacks travel as wheels in .whl/ (the device tool's notes).
# Logs go to $OUT (default /tmp/gpu_checks); the benchmark's summaries, curves and the
# runs' logs.csv and episodes.csv stay there, their checkpoints and TensorBoard files not.
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

PARTS=${GPU_PARTS:-pong18 sac_halfcheetah parity}
# 8 minutes from the script's start (bash's SECONDS), the set-up above included;
# --kill-after's 20 s of grace are kept out of every part's share.
DEADLINE=480
# [TAIL=N] [REPORT=FILE] part NAME SECONDS COMMAND...: run it, keep its output, say how it
# ended, show the last N lines of its output and, from the benchmark's summary.md
# REPORT, each run's block (its lines cut at 600 characters)
part() {
  local name=$1 seconds=$2
  shift 2
  [[ " $PARTS " == *" $name "* ]] || return 0
  local left=$((DEADLINE - SECONDS - 20))
  if ((left < 20)); then
    echo "== $name: skipped, $((DEADLINE - SECONDS)) s left of the 8 minutes"
    return 0
  fi
  ((seconds > left)) && seconds=$left
  local start=$SECONDS
  timeout -s INT --kill-after=20 "$seconds" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - start)) s (limit $seconds s)"
  tail -n "${TAIL:-12}" "$OUT/$name.log"
  if [[ -f ${REPORT:-} ]]; then
    sed -n '/^## seed/,/^- curve/p' "$REPORT" | cut -c1-600
  fi
}

# benchmarks/atari.py's budget counts from the run's launch; a part's limit adds the
# run's exit (at most --exit_timeout), the check for processes left (up to 10 s) and
# the curves. Cut short by its limit, the benchmark still reports the run so far.
TAIL=2 REPORT=$OUT/pong18/summary.md part pong18 340 \
  python3 -m benchmarks.atari --budget 300 --stop_at_threshold --warmup 60 \
  --exit_timeout 15 --out "$OUT/pong18" -- --num_actors auto
# SAC's first update compiles and captures its graph (43 s cold on 2026-11-28): the
# steady rate counts from 55 s after launch.
TAIL=2 REPORT=$OUT/sac_halfcheetah/summary.md part sac_halfcheetah 130 \
  python3 -m benchmarks.atari --algo sac --env HalfCheetah-v5 --threshold inf \
  --budget 100 --warmup 55 --exit_timeout 15 --out "$OUT/sac_halfcheetah" \
  -- --compile on --learning_starts 5000
BEAST_DEBUG_COMPILE=1 part parity 90 python3 -m pytest -q -p no:cacheprovider -n 0 \
  tests/learning -k cuda
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
find "$OUT" \( -name '*.tar' -o -name 'events.out.tfevents.*' \) -delete
echo "== $((SECONDS)) s in all"
