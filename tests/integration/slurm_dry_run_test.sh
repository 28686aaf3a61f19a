#!/usr/bin/env bash
# scripts/slurm without Slurm or a build (ctest: slurm_launch_dry_run).
#  - relay-launch.sh --dry-run for fake allocations: the srun commands, the
#    rank placement, the addresses and overrides, and errors naming the
#    variable at fault;
#  - the bash node-list expander;
#  - relay-rank.sh, the per-task wrapper;
#  - the real launch path with stand-ins for srun, scontrol and the relay
#    binaries: signal forwarding and the requeue decision.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
launch=$root/scripts/slurm/relay-launch.sh
rank=$root/scripts/slurm/relay-rank.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
expect_eq() { # DESCRIPTION ACTUAL EXPECTED
  [[ $2 == "$3" ]] || fail "$1: got '$2', want '$3'"
}
expect_has() { # DESCRIPTION TEXT NEEDLE
  [[ $2 == *"$3"* ]] || fail "$1: '$3' not in: $2"
}
expect_lacks() { # DESCRIPTION TEXT NEEDLE
  [[ $2 != *"$3"* ]] || fail "$1: '$3' should not be in: $2"
}
# True when the shell-quoted command line $1 has the word $2.
has_word() {
  local -a words
  eval "words=($1)"
  local w
  for w in "${words[@]}"; do [[ $w == "$2" ]] && return 0; done
  return 1
}
expect_word() { has_word "$2" "$3" || fail "$1: no argument '$3' in: $2"; }
expect_no_word() { ! has_word "$2" "$3" || fail "$1: unexpected argument '$3' in: $2"; }
# The word after $2 in command line $1.
word_after() {
  local -a words
  eval "words=($1)"
  local i
  for ((i = 0; i + 1 < ${#words[@]}; i++)); do
    [[ ${words[i]} == "$2" ]] && printf '%s' "${words[i + 1]}" && return
  done
}

# The launcher in a clean environment (no SLURM_* of a job this test may run
# in): run_launch VAR=VALUE... -- ARGS...; sets out, err and rc.
run_launch() {
  local -a vars=()
  while [[ $1 != -- ]]; do
    vars+=("$1")
    shift
  done
  shift
  rc=0
  env -i PATH="$PATH" HOME="$tmp" "${vars[@]}" bash "$launch" "$@" > "$tmp/out" 2> "$tmp/err" || rc=$?
  out=$(< "$tmp/out")
  err=$(< "$tmp/err")
}
# expect_error DESCRIPTION NEEDLE VAR=VALUE... -- ARGS...: fails, naming NEEDLE.
expect_error() {
  local what=$1 needle=$2
  shift 2
  run_launch "$@"
  ((rc != 0)) || fail "$what: exit status 0, want an error; output: $out"
  expect_has "$what: message" "$err" "$needle"
}

token=s3cret-token-0123
base=(CONFIG=/shared/arith.yaml RUN_DIR=/shared/runs/arith RELAY_BIN=/opt/relay/bin)
het=("${base[@]}" "RELAY_TOKEN=$token"
  SLURM_JOB_NODELIST_HET_GROUP_0='gpu[01-02]' SLURM_NTASKS_PER_NODE_HET_GROUP_0=2
  SLURM_NTASKS_HET_GROUP_0=4 SLURM_CPUS_PER_TASK_HET_GROUP_0=8 SLURM_GPUS_PER_NODE_HET_GROUP_0=h100:2
  SLURM_JOB_NODELIST_HET_GROUP_1='cpu[1-2],cpu7' SLURM_NTASKS_HET_GROUP_1=3
  SLURM_NTASKS_PER_NODE_HET_GROUP_1=1 SLURM_CPUS_PER_TASK_HET_GROUP_1=16)

# ---------------------------------------------------------------- node lists
expand_case() { # LIST EXPECTED (space-separated)
  run_launch -- --expand "$1"
  expect_eq "expand $1: status" "$rc" 0
  expect_eq "expand $1" "$(tr '\n' ' ' <<< "$out" | sed 's/ $//')" "$2"
}
expand_case 'gpu[01-03,07],cpu5' 'gpu01 gpu02 gpu03 gpu07 cpu5'
expand_case 'node[8-10]' 'node8 node9 node10'
expand_case 'node[098-101]' 'node098 node099 node100 node101'
expand_case 'rack[1-2]-n[01-02]' 'rack1-n01 rack1-n02 rack2-n01 rack2-n02'
expand_case 'login' 'login'
expand_case 'a[1],b[3-4]c' 'a1 b3c b4c'
for bad in 'gpu[01-03' 'gpu01]' 'gpu[3-1]' 'a,,b' 'gpu[]' 'gpu[x]' 'a[1[2]]'; do
  expect_error "expand '$bad'" "--expand:" -- --expand "$bad"
  expect_eq "expand '$bad': no partial output" "$out" ""
done

# ---------------------------------------------------------------- het job
run_launch "${het[@]}" -- --dry-run -- experiment.steps=100 "task.note=it's"
expect_eq "het dry run: status" "$rc" 0
mapfile -t trainer_lines < <(grep '^srun .*relay-trainer' <<< "$out")
mapfile -t worker_lines < <(grep '^srun .*relay-rollout' <<< "$out")
mapfile -t check_lines < <(grep '^/opt/relay/bin/relay config check ' <<< "$out")
expect_eq "one trainer step" "${#trainer_lines[@]}" 1
expect_eq "one worker step per worker" "${#worker_lines[@]}" 3
expect_eq "config checks" "${#check_lines[@]}" 2
expect_eq "no other commands" "$(grep -vc '^#' <<< "$out")" 6
t=${trainer_lines[0]:-}
for w in --het-group=0 --nodes=2 --ntasks=4 --ntasks-per-node=2 --nodelist=gpu01,gpu02 \
  --distribution=block --cpus-per-task=8 --gpus-per-node=2 \
  --export=ALL,MASTER_ADDR=gpu01,MASTER_PORT=29500,WORLD_SIZE=4,RELAY_RANK0_NODE=gpu01 \
  "$rank" /opt/relay/bin/relay-trainer /shared/arith.yaml services.listen=0.0.0.0:50051 \
  trainer.world_size=4 trainer.rendezvous=gpu01:29500 run.threads=8 experiment.steps=100 \
  "task.note=it's"; do
  expect_word "trainer step" "$t" "$w"
done
expect_eq "trainer --run-dir" "$(word_after "$t" --run-dir)" /shared/runs/arith
expect_no_word "trainer: run.device only when asked" "$t" run.device=cuda
[[ $t == *"relay-rank.sh /opt/relay/bin/relay-trainer "* ]] ||
  fail "relay-rank.sh wraps relay-trainer: $t"
for r in "0: node gpu01, LOCAL_RANK 0" "1: node gpu01, LOCAL_RANK 1" \
  "2: node gpu02, LOCAL_RANK 0" "3: node gpu02, LOCAL_RANK 1"; do
  expect_has "rank placement" "$out" "# trainer rank $r"$'\n'
done
expect_lacks "no rank 4" "$out" "trainer rank 4"
i=0
for node in cpu1 cpu2 cpu7; do
  w=${worker_lines[i]:-}
  expect_word "worker $i" "$w" --het-group=1
  expect_word "worker $i" "$w" "--nodelist=$node"
  expect_word "worker $i" "$w" --cpus-per-task=16
  expect_word "worker $i" "$w" run.threads=16
  expect_word "worker $i" "$w" experiment.steps=100
  expect_eq "worker $i --trainer" "$(word_after "$w" --trainer)" gpu01:50051
  expect_eq "worker $i --name" "$(word_after "$w" --name)" "$node-0"
  expect_eq "worker $i --reconnect-s" "$(word_after "$w" --reconnect-s)" 600
  expect_no_word "worker $i: trainer keys" "$w" trainer.world_size=4
  expect_no_word "worker $i: one worker per node needs no --exact" "$w" --exact
  i=$((i + 1))
done
expect_word "trainer config check" "${check_lines[0]}" trainer.rendezvous=gpu01:29500
expect_word "worker config check" "${check_lines[1]}" run.threads=16
expect_lacks "token value never printed" "$out$err" "$token"
expect_lacks "no --token" "$out" "--token"
expect_has "token goes by the environment" "$out" "# RELAY_TOKEN: set"
expect_lacks "token set: no warning" "$err" "neither RELAY_TOKEN"

# Ports, device, token file, suffix, extra arguments.
run_launch "${het[@]}" PORT=6000 MASTER_PORT=6001 WEIGHT_SYNC_PORT=6002 HTTP_LISTEN=0.0.0.0:9090 \
  RELAY_DEVICE=cuda RELAY_WORKER_DEVICE=cpu RELAY_TOKEN= RELAY_TOKEN_FILE=/etc/relay/token \
  TRAINER_HOST_SUFFIX=.hpc.example RECONNECT_S=900 WORKER_ARGS='--groups-in-flight 4' -- --dry-run
expect_eq "settings: status" "$rc" 0
t=$(grep '^srun .*relay-trainer' <<< "$out" || true)
w=$(grep -m1 '^srun .*relay-rollout' <<< "$out" || true)
for x in services.listen=0.0.0.0:6000 trainer.rendezvous=gpu01.hpc.example:6001 \
  services.weight_sync_port=6002 services.http_listen=0.0.0.0:9090 run.device=cuda \
  services.token_file=/etc/relay/token \
  --export=ALL,MASTER_ADDR=gpu01.hpc.example,MASTER_PORT=6001,WORLD_SIZE=4,RELAY_RANK0_NODE=gpu01; do
  expect_word "settings: trainer" "$t" "$x"
done
expect_eq "settings: worker --trainer" "$(word_after "$w" --trainer)" gpu01.hpc.example:6000
expect_eq "settings: worker --reconnect-s" "$(word_after "$w" --reconnect-s)" 900
expect_eq "settings: worker --groups-in-flight" "$(word_after "$w" --groups-in-flight)" 4
for x in run.device=cpu services.token_file=/etc/relay/token; do
  expect_word "settings: worker" "$w" "$x"
done
expect_no_word "settings: worker device" "$w" run.device=cuda

# No token anywhere: a warning, not an error.
run_launch "${het[@]}" RELAY_TOKEN= -- --dry-run
expect_eq "no token: status" "$rc" 0
expect_has "no token: warning" "$err" "neither RELAY_TOKEN nor RELAY_TOKEN_FILE"

# ---------------------------------------------------------------- plain job, flags
run_launch "${base[@]}" SLURM_JOB_NODELIST='node[1-4]' TRAINER_NODES=2 SLURM_NTASKS_PER_NODE=1 -- --dry-run
expect_eq "plain job: status" "$rc" 0
t=$(grep '^srun .*relay-trainer' <<< "$out" || true)
expect_word "plain job: trainer nodes" "$t" --nodelist=node1,node2
expect_word "plain job: world size" "$t" trainer.world_size=2
expect_no_word "plain job: no het group" "$t" --het-group=0
expect_eq "plain job: workers" "$(grep '^srun .*relay-rollout' <<< "$out" | sed -E 's/.*--name ([^ ]+).*/\1/' | tr '\n' ' ')" \
  "node3-0 node4-0 "

run_launch "${base[@]}" -- --dry-run --trainer-nodes gpu5 --worker-nodes 'cpu[1-2]' --ranks-per-node 3 \
  --workers-per-node 2
expect_eq "flags: status" "$rc" 0
expect_word "flags: world size" "$(grep '^srun .*relay-trainer' <<< "$out")" trainer.world_size=3
expect_eq "flags: workers" "$(grep '^srun .*relay-rollout' <<< "$out" | sed -E 's/.*--name ([^ ]+).*/\1/' | tr '\n' ' ')" \
  "cpu1-0 cpu1-1 cpu2-0 cpu2-1 "
expect_word "flags: several workers per node use --exact" "$(grep -m1 '^srun .*relay-rollout' <<< "$out")" --exact

# ---------------------------------------------------------------- bad input
expect_error "no node list" SLURM_JOB_NODELIST "${base[@]}" -- --dry-run
expect_error "no CONFIG" "CONFIG is not set" RUN_DIR=/r SLURM_JOB_NODELIST='n[1-2]' -- --dry-run
expect_error "no RUN_DIR" "RUN_DIR is not set" CONFIG=/c SLURM_JOB_NODELIST='n[1-2]' -- --dry-run
expect_error "no worker component" SLURM_JOB_NODELIST_HET_GROUP_1 "${base[@]}" \
  SLURM_JOB_NODELIST_HET_GROUP_0=gpu01 -- --dry-run
expect_error "bad worker node list" "SLURM_JOB_NODELIST_HET_GROUP_1: unbalanced" "${het[@]}" \
  SLURM_JOB_NODELIST_HET_GROUP_1='cpu[1-2' -- --dry-run
expect_error "tasks != ranks" "SLURM_NTASKS_HET_GROUP_0=3" "${het[@]}" SLURM_NTASKS_HET_GROUP_0=3 -- --dry-run
expect_error "tasks != workers" "SLURM_NTASKS_HET_GROUP_1=5" "${het[@]}" SLURM_NTASKS_HET_GROUP_1=5 -- --dry-run
expect_error "world size mismatch" "TRAINER_WORLD_SIZE=8" "${het[@]}" TRAINER_WORLD_SIZE=8 -- --dry-run
expect_error "ranks per node" "TRAINER_RANKS_PER_NODE: must be >= 1" "${het[@]}" TRAINER_RANKS_PER_NODE=0 -- --dry-run
expect_error "more ranks than GPUs" "TRAINER_GPUS_PER_NODE=2" "${het[@]}" RELAY_DEVICE=cuda \
  TRAINER_RANKS_PER_NODE=3 SLURM_NTASKS_HET_GROUP_0= -- --dry-run
expect_error "bad device" "RELAY_DEVICE: must be cpu or cuda" "${het[@]}" RELAY_DEVICE=gpu -- --dry-run
expect_error "bad PORT" "PORT: must be a whole number" "${het[@]}" PORT=http -- --dry-run
expect_error "port clash" "MASTER_PORT=50051 is also PORT" "${het[@]}" MASTER_PORT=50051 -- --dry-run
expect_error "plain job without workers" "TRAINER_NODES=2 leaves no worker node" "${base[@]}" \
  SLURM_JOB_NODELIST='n[1-2]' TRAINER_NODES=2 -- --dry-run
expect_error "token on the command line" "RELAY_TOKEN" "${het[@]}" -- --dry-run -- --token "$token"
expect_lacks "token on the command line: not echoed" "$out" "$token"
expect_error "token in WORKER_ARGS" "WORKER_ARGS: pass the token" "${het[@]}" WORKER_ARGS="--token=x" -- --dry-run
expect_error "world size override" "trainer.world_size=2" "${het[@]}" -- --dry-run trainer.world_size=2
expect_error "not an override" "'steps' is not a key=value override" "${het[@]}" -- --dry-run steps

# ---------------------------------------------------------------- relay-rank.sh
rc=0
got=$(env -i PATH="$PATH" SLURM_PROCID=3 SLURM_LOCALID=1 WORLD_SIZE=4 SLURMD_NODENAME=gpu02 \
  RELAY_RANK0_NODE=gpu01 bash "$rank" env 2>&1) || rc=$?
expect_eq "rank wrapper: status" "$rc" 0
got=$'\n'$got$'\n'
expect_has "rank wrapper: RANK" "$got" $'\nRANK=3\n'
expect_has "rank wrapper: LOCAL_RANK" "$got" $'\nLOCAL_RANK=1\n'
rank_error() { # DESCRIPTION NEEDLE VAR=VALUE...
  local what=$1 needle=$2 e
  shift 2
  rc=0
  e=$(env -i PATH="$PATH" "$@" bash "$rank" true 2>&1) || rc=$?
  ((rc != 0)) || fail "$what: exit status 0, want an error"
  expect_has "$what" "$e" "$needle"
}
rank_error "rank 0 on the wrong node" "rank 0 started on gpu02, but MASTER_ADDR points at gpu01" \
  SLURM_PROCID=0 SLURM_LOCALID=0 WORLD_SIZE=4 SLURMD_NODENAME=gpu02 RELAY_RANK0_NODE=gpu01
rank_error "no SLURM_PROCID" "SLURM_PROCID: not set" SLURM_LOCALID=0 WORLD_SIZE=4
rank_error "rank beyond WORLD_SIZE" "SLURM_PROCID=4 is not below WORLD_SIZE=4" \
  SLURM_PROCID=4 SLURM_LOCALID=0 WORLD_SIZE=4

# ---------------------------------------------------------------- the real path
# Stand-ins: srun applies --export's assignments, runs its command as task 0
# and forwards SIGTERM, as the real one does; scontrol expands two list
# names the bash expander would keep as they are (proving it is preferred)
# and records requeues; relay-trainer and relay-rollout act per FAKE_TRAINER.
fake=$tmp/fake
mkdir -p "$fake/bin" "$fake/relay"
echo "experiment: {steps: 3}" > "$fake/arith.yaml"
cat > "$fake/bin/srun" << 'EOF'
#!/usr/bin/env bash
echo "$*" >> "$FAKE_DIR/srun.calls"
while [[ $1 == -* ]]; do
  if [[ $1 == --export=* ]]; then
    IFS=, read -ra kv <<< "${1#--export=}"
    for x in "${kv[@]}"; do [[ $x == ALL ]] || export "${x?}"; done
  fi
  shift
done
export SLURM_PROCID=0 SLURM_LOCALID=0
# The trap goes in before the task starts, as the real srun handles signals
# from its start: a SIGTERM that came between the fork and a later trap
# killed this stand-in and orphaned its task without forwarding.
child=""
pending=0
trap 'if [[ -n $child ]]; then kill -TERM $child; else pending=1; fi' TERM
"$@" &
child=$!
((pending == 0)) || kill -TERM $child
while :; do
  rc=0
  wait $child || rc=$?
  ((rc > 128)) && kill -0 $child 2> /dev/null && continue
  exit $rc
done
EOF
cat > "$fake/bin/scontrol" << 'EOF'
#!/usr/bin/env bash
echo "$*" >> "$FAKE_DIR/scontrol.calls"
case "$1 $2 ${3:-}" in
  "show hostnames trainers") echo gpu01 ;;
  "show hostnames workers") printf 'cpu1\ncpu2\n' ;;
  requeue*) ;;
  *) exit 1 ;;
esac
EOF
cat > "$fake/relay/relay" << 'EOF'
#!/usr/bin/env bash
echo "$*" >> "$FAKE_DIR/relay.calls"
EOF
cat > "$fake/relay/relay-trainer" << 'EOF'
#!/usr/bin/env bash
echo "trainer RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE MASTER_ADDR=$MASTER_ADDR token=${RELAY_TOKEN:+set}"
case $FAKE_TRAINER in
  done) # after the workers are up, so that stopping them is what is tested
    for ((n = 0; n < 100; n++)); do
      [[ -e $FAKE_DIR/cpu1-0.ready && -e $FAKE_DIR/cpu2-0.ready ]] && break
      sleep 0.05
    done
    echo "done: version 3, step 3 of 3" && exit 0 ;;
  crash) exit 3 ;;
esac
trap 'echo "stopped: version 1, step 1 of 3"; exit 0' TERM
touch "$FAKE_DIR/trainer.ready"
while :; do sleep 0.2; done
EOF
cat > "$fake/relay/relay-rollout" << 'EOF'
#!/usr/bin/env bash
while [[ $1 != --name ]]; do shift; done
name=$2
trap 'touch "$FAKE_DIR/$name.term"; exit 0' TERM
touch "$FAKE_DIR/$name.ready"
while :; do sleep 0.2; done
EOF
chmod +x "$fake"/bin/* "$fake"/relay/*

# real_run MODE SIGNAL [VAR=VALUE...]: a fresh run directory; sends SIGNAL
# (or nothing) once the trainer and both workers are up; sets rc and err.
real_run() {
  local mode=$1 sig=$2 pid n
  shift 2
  rm -rf "$fake/state" "$fake/run"
  mkdir -p "$fake/state"
  env -i PATH="$fake/bin:$PATH" FAKE_DIR="$fake/state" FAKE_TRAINER="$mode" CONFIG="$fake/arith.yaml" \
    RUN_DIR="$fake/run" RELAY_BIN="$fake/relay" RELAY_TOKEN=$token SLURM_JOB_ID=77 WORKER_STOP_S=5 \
    SLURM_JOB_NODELIST_HET_GROUP_0=trainers SLURM_JOB_NODELIST_HET_GROUP_1=workers "$@" \
    bash "$launch" > "$fake/out" 2> "$fake/err" &
  pid=$!
  if [[ $sig != none ]]; then
    for ((n = 0; n < 200; n++)); do
      [[ -e $fake/state/trainer.ready && -e $fake/state/cpu1-0.ready && -e $fake/state/cpu2-0.ready ]] && break
      sleep 0.05
    done
    kill "-$sig" "$pid"
  fi
  rc=0
  wait "$pid" || rc=$?
  err=$(< "$fake/err")
}
requeues() { grep -c '^requeue' "$fake/state/scontrol.calls" 2> /dev/null || true; }

real_run wait USR1
expect_eq "USR1: status" "$rc" 0
expect_eq "USR1: requeued once" "$(requeues)" 1
expect_has "USR1: requeue of the job" "$(< "$fake/state/scontrol.calls")" "requeue 77"
[[ -e $fake/state/cpu1-0.term && -e $fake/state/cpu2-0.term ]] || fail "USR1: workers got no SIGTERM"
log=$fake/run/logs/trainer.77.0.log
expect_has "USR1: trainer env" "$(< "$log")" \
  "trainer RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=gpu01 token=set"
expect_has "USR1: stopped" "$(< "$log")" "stopped: version 1"
expect_eq "config checked before the launch" "$(wc -l < "$fake/state/relay.calls")" 2
expect_lacks "token not on any srun command line" "$(< "$fake/state/srun.calls")" "$token"

real_run wait USR2
expect_eq "USR2: status" "$rc" 0
expect_eq "USR2: not requeued" "$(requeues)" 0
expect_has "USR2: says so" "$err" "not requeued"

real_run "done" none
expect_eq "done: status" "$rc" 0
expect_eq "done: not requeued" "$(requeues)" 0
[[ -e $fake/state/cpu1-0.term ]] || fail "done: workers not stopped once the trainer was gone"

real_run crash none
expect_eq "crash: trainer's status" "$rc" 3
expect_eq "crash: not requeued" "$(requeues)" 0

real_run wait USR1 SLURM_RESTART_COUNT=2 MAX_REQUEUES=2
expect_eq "requeue limit: status" "$rc" 1
expect_eq "requeue limit: not requeued" "$(requeues)" 0
expect_has "requeue limit: says so" "$err" "MAX_REQUEUES=2"
[[ -e $fake/run/logs/trainer.77.2.log ]] || fail "one trainer log per attempt (SLURM_RESTART_COUNT)"

if ((failures)); then
  echo "slurm_dry_run_test: $failures failure(s)" >&2
  exit 1
fi
echo "slurm_dry_run_test: all passed"
