#!/usr/bin/env bash
# relay-launch.sh: start relay-trainer ranks and relay-rollout workers on a
# Slurm allocation, from one config; stop them on a signal and requeue the job
# when the trainer stopped before its last step. relay.sbatch execs it; see
# docs/cluster.md, "A Slurm job".
#
#   relay-launch.sh [--dry-run] [--trainer-nodes LIST --worker-nodes LIST]
#                   [--ranks-per-node N] [--workers-per-node N] [--] [key=value ...]
#   relay-launch.sh --expand LIST      print the hosts of a Slurm node list
#
# key=value overrides go to every process. --dry-run prints the commands, one
# per line (comments start with #), and runs nothing; it needs no Slurm.
#
# The allocation, first match wins:
#   --trainer-nodes/--worker-nodes    explicit node lists (e.g. 'gpu[01-02]')
#   SLURM_JOB_NODELIST_HET_GROUP_0/1  a heterogeneous job: component 0 trains,
#                                     component 1 runs the workers
#   SLURM_JOB_NODELIST                one job: its first TRAINER_NODES nodes
#                                     train (default 1), the others run workers
# Environment (defaults in brackets):
#   CONFIG                 the experiment YAML, the same for every process (required)
#   RUN_DIR                run directory on storage the trainer node sees after a
#                          requeue (required)
#   RELAY_BIN              directory of relay, relay-trainer, relay-rollout [<checkout>/build/src]
#   PORT                   trainer gRPC port, services.listen=0.0.0.0:PORT [50051]
#   MASTER_PORT            rank 0's rendezvous store, trainer.rendezvous [29500]
#   HTTP_LISTEN            services.http_listen [the config's]
#   WEIGHT_SYNC_PORT       services.weight_sync_port [the config's]
#   RELAY_TOKEN            shared token; reaches every process in the environment
#   RELAY_TOKEN_FILE       or a token file every node can read: services.token_file
#   TRAINER_RANKS_PER_NODE trainer ranks per node [the trainer component's
#                          --ntasks-per-node, else 1]
#   TRAINER_WORLD_SIZE     if set, must equal trainer nodes x ranks per node
#   TRAINER_GPUS_PER_NODE  GPUs the trainer step takes per node [its --gpus-per-node]
#   TRAINER_CPUS_PER_RANK  --cpus-per-task and run.threads [its --cpus-per-task]
#   WORKERS_PER_NODE       workers per worker node [the worker component's
#                          --ntasks-per-node, else 1]
#   WORKER_CPUS            --cpus-per-task and run.threads of a worker [its --cpus-per-task]
#   WORKER_GPUS            GPUs per worker (srun --gres=gpu:N) [0]
#   RELAY_DEVICE           run.device for the trainer (cpu|cuda) [not passed]
#   RELAY_WORKER_DEVICE    run.device for the workers [RELAY_DEVICE]
#   TRAINER_HOST_SUFFIX    appended to the first trainer node's name to form
#                          MASTER_ADDR, e.g. .cluster.example [none]
#   RECONNECT_S            relay-rollout --reconnect-s [600]
#   TRAINER_ARGS           extra relay-trainer arguments, split at spaces
#   WORKER_ARGS            extra relay-rollout arguments (mutual TLS certificates)
#   LOG_DIR                trainer output, one file per attempt [RUN_DIR/logs]
#   MAX_REQUEUES           give up requeueing after this many restarts [20]
#   WORKER_STOP_S          seconds workers get to exit once the trainer is gone [60]
# Signals: SIGUSR1 (sbatch --signal=B:USR1@T) stops every process (the trainer
# checkpoints) and requeues the job; SIGUSR2 stops without requeueing.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() {
  echo "relay-launch: $*" >&2
  exit 2
}
note() { echo "relay-launch: $*" >&2; }

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

# ---------------------------------------------------------------- node lists

# Prints the hosts of one node-list item, which may hold several bracket
# groups (rack[1-2]-n[01-02]): the first group is expanded and each result
# recursed on. Zero padding follows the range's first number, as in Slurm.
expand_item() {
  local item=$1 name=$2 prefix rest ranges suffix range lo hi n
  if [[ $item != *'['* ]]; then
    [[ $item != *']'* ]] || die "$name: unbalanced ']' in '$item'"
    printf '%s\n' "$item"
    return
  fi
  prefix=${item%%'['*}
  rest=${item#*'['}
  [[ $rest == *']'* ]] || die "$name: unbalanced '[' in '$item'"
  ranges=${rest%%']'*}
  suffix=${rest#*']'}
  [[ -n $ranges ]] || die "$name: empty brackets in '$item'"
  local IFS=,
  for range in $ranges; do
    if [[ $range =~ ^([0-9]+)-([0-9]+)$ ]]; then
      lo=${BASH_REMATCH[1]} hi=${BASH_REMATCH[2]}
      ((10#$lo <= 10#$hi)) || die "$name: range $range runs backwards in '$item'"
      for ((n = 10#$lo; n <= 10#$hi; n++)); do
        expand_item "$prefix$(printf '%0*d' "${#lo}" "$n")$suffix" "$name"
      done
    elif [[ $range =~ ^[0-9]+$ ]]; then
      expand_item "$prefix$range$suffix" "$name"
    else
      die "$name: '$range' in '$item' is not a number or a range N-M"
    fi
  done
}

# Prints the hosts of a Slurm node list, one per line, in order. Commas inside
# brackets separate ranges, not items, hence the depth count.
expand_nodelist() {
  local list=$1 name=$2 depth=0 start=0 i ch
  local -a items=()
  [[ -n $list ]] || die "$name: empty node list"
  [[ $list != *[[:space:]]* ]] || die "$name: spaces in node list '$list'"
  for ((i = 0; i < ${#list}; i++)); do
    ch=${list:i:1}
    case $ch in
      '[') depth=$((depth + 1)) ;;
      ']') depth=$((depth - 1)) ;;
      ',') if ((depth == 0)); then
        items+=("${list:start:i-start}")
        start=$((i + 1))
      fi ;;
    esac
    ((depth >= 0 && depth <= 1)) || die "$name: unbalanced or nested brackets in '$list'"
  done
  ((depth == 0)) || die "$name: unbalanced '[' in '$list'"
  items+=("${list:start}")
  for i in "${items[@]}"; do
    [[ -n $i ]] || die "$name: empty entry in '$list'"
    expand_item "$i" "$name"
  done
}

# Fills the array named $1 with the hosts of list $2 (from variable $3).
# Inside a job, scontrol knows every form Slurm writes; the bash expander is
# the fallback and what a dry run uses, so that its output does not depend on
# the machine it runs on.
hosts_into() {
  local out
  if ((!dry_run)) && command -v scontrol > /dev/null &&
    out=$(scontrol show hostnames "$2" 2> /dev/null) && [[ -n $out ]]; then
    :
  else
    out=$(expand_nodelist "$2" "$3") || exit 2
  fi
  mapfile -t "$1" <<< "$out"
}

# ---------------------------------------------------------------- checks

# Checks that variable $1 (value $2) is a whole number >= $3 (and <= $4).
check_int() {
  local name=$1 value=$2 min=$3 max=${4:-}
  [[ $value =~ ^[0-9]+$ ]] || die "$name: must be a whole number, got '$value'"
  ((10#$value >= min)) || die "$name: must be >= $min, got $value"
  [[ -z $max ]] || ((10#$value <= max)) || die "$name: must be <= $max, got $value"
}

# Rejects arguments the launcher derives from the allocation, and a token on
# a command line (visible to every user in ps and kept in Slurm's records).
check_args() {
  local name=$1 arg
  shift
  for arg in "$@"; do
    case $arg in
      --token | --token=*)
        die "$name: pass the token in RELAY_TOKEN or RELAY_TOKEN_FILE, not --token (command lines are visible to every user)" ;;
      trainer.world_size=* | trainer.rendezvous=* | services.listen=* | --listen | --listen=* | \
        --run-dir | --run-dir=* | --trainer | --trainer=* | --name | --name=*)
        die "$name: '$arg' is set by relay-launch from the allocation (use PORT, MASTER_PORT, RUN_DIR)" ;;
    esac
  done
}

# Prints one command as a shell-quoted line.
print_cmd() {
  local out="" a q="'"
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
      out+="$a "
    else
      out+="'${a//$q/$q\\$q$q}' "
    fi
  done
  printf '%s\n' "${out% }"
}

join_by() {
  local IFS=$1
  shift
  printf '%s' "$*"
}

# ---------------------------------------------------------------- arguments

dry_run=0
trainer_list="" worker_list=""
overrides=()
while (($#)); do
  case $1 in
    --dry-run) dry_run=1 ;;
    --trainer-nodes | --worker-nodes | --ranks-per-node | --workers-per-node | --expand)
      [[ $# -ge 2 ]] || die "$1 needs a value"
      case $1 in
        --trainer-nodes) trainer_list=$2 ;;
        --worker-nodes) worker_list=$2 ;;
        --ranks-per-node) TRAINER_RANKS_PER_NODE=$2 ;;
        --workers-per-node) WORKERS_PER_NODE=$2 ;;
        --expand)
          # Whole or nothing: no partial list before an error.
          out=$(expand_nodelist "$2" --expand) || exit 2
          printf '%s\n' "$out"
          exit 0
          ;;
      esac
      shift
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    --)
      shift
      overrides+=("$@")
      break
      ;;
    -*) die "unknown option '$1' (--help lists them)" ;;
    *) overrides+=("$1") ;;
  esac
  shift
done
for a in "${overrides[@]}"; do
  [[ $a != --token* ]] || check_args "command line" "$a"
  [[ $a == *=* && $a != -* ]] || die "command line: '$a' is not a key=value override"
done
check_args "command line" "${overrides[@]}"
read -ra trainer_args <<< "${TRAINER_ARGS:-}"
read -ra worker_args <<< "${WORKER_ARGS:-}"
check_args TRAINER_ARGS "${trainer_args[@]}"
check_args WORKER_ARGS "${worker_args[@]}"

[[ -n ${CONFIG:-} ]] || die "CONFIG is not set: the experiment YAML every process reads"
[[ -n ${RUN_DIR:-} ]] || die "RUN_DIR is not set: the trainer's run directory, on storage it sees again after a requeue"
RELAY_BIN=${RELAY_BIN:-$(cd "$here/../.." && pwd)/build/src}

# ---------------------------------------------------------------- allocation

het=0
trainer_nodes=() worker_nodes=() job_nodes=()
if [[ -n $trainer_list || -n $worker_list ]]; then
  [[ -n $trainer_list ]] || die "--worker-nodes needs --trainer-nodes too"
  [[ -n $worker_list ]] || die "--trainer-nodes needs --worker-nodes too"
  hosts_into trainer_nodes "$trainer_list" --trainer-nodes
  hosts_into worker_nodes "$worker_list" --worker-nodes
elif [[ -n ${SLURM_JOB_NODELIST_HET_GROUP_0:-} ]]; then
  het=1
  [[ -n ${SLURM_JOB_NODELIST_HET_GROUP_1:-} ]] ||
    die "SLURM_JOB_NODELIST_HET_GROUP_1 is not set: the heterogeneous job needs a second component (#SBATCH hetjob) for the workers"
  hosts_into trainer_nodes "$SLURM_JOB_NODELIST_HET_GROUP_0" SLURM_JOB_NODELIST_HET_GROUP_0
  hosts_into worker_nodes "$SLURM_JOB_NODELIST_HET_GROUP_1" SLURM_JOB_NODELIST_HET_GROUP_1
elif [[ -n ${SLURM_JOB_NODELIST:-} ]]; then
  hosts_into job_nodes "$SLURM_JOB_NODELIST" SLURM_JOB_NODELIST
  n=${TRAINER_NODES:-1}
  check_int TRAINER_NODES "$n" 1
  ((10#$n < ${#job_nodes[@]})) ||
    die "TRAINER_NODES=$n leaves no worker node: SLURM_JOB_NODELIST has ${#job_nodes[@]} node(s)"
  trainer_nodes=("${job_nodes[@]:0:10#$n}")
  worker_nodes=("${job_nodes[@]:10#$n}")
else
  die "no node list: run inside a Slurm job (SLURM_JOB_NODELIST_HET_GROUP_0/1 or SLURM_JOB_NODELIST) or pass --trainer-nodes and --worker-nodes"
fi

# Per-component settings: a heterogeneous job has them per group, a plain job
# once for all nodes. $1 = the plain variable's name.
slurm_var() {
  local name=$1
  ((het)) && name=${1}_HET_GROUP_$2
  printf '%s' "${!name:-}"
}
slurm_name() { if ((het)); then printf '%s_HET_GROUP_%s' "$1" "$2"; else printf '%s' "$1"; fi; }

ranks_name=TRAINER_RANKS_PER_NODE
ranks_per_node=${TRAINER_RANKS_PER_NODE:-}
if [[ -z $ranks_per_node ]]; then
  ranks_name=$(slurm_name SLURM_NTASKS_PER_NODE 0)
  ranks_per_node=$(slurm_var SLURM_NTASKS_PER_NODE 0)
  ranks_per_node=${ranks_per_node:-1}
fi
check_int "$ranks_name" "$ranks_per_node" 1
ranks_per_node=$((10#$ranks_per_node))
world_size=$((${#trainer_nodes[@]} * ranks_per_node))
size_text="${#trainer_nodes[@]} trainer node(s) x $ranks_per_node rank(s) per node ($ranks_name) = $world_size"
if [[ -n ${TRAINER_WORLD_SIZE:-} ]]; then
  check_int TRAINER_WORLD_SIZE "$TRAINER_WORLD_SIZE" 1
  ((10#$TRAINER_WORLD_SIZE == world_size)) ||
    die "TRAINER_WORLD_SIZE=$TRAINER_WORLD_SIZE does not match the allocation: $size_text"
fi
if ((het)) && [[ -n ${SLURM_NTASKS_HET_GROUP_0:-} ]]; then
  check_int SLURM_NTASKS_HET_GROUP_0 "$SLURM_NTASKS_HET_GROUP_0" 1
  ((SLURM_NTASKS_HET_GROUP_0 == world_size)) ||
    die "SLURM_NTASKS_HET_GROUP_0=$SLURM_NTASKS_HET_GROUP_0 tasks, but $size_text: one task per trainer rank"
fi

workers_name=WORKERS_PER_NODE
workers_per_node=${WORKERS_PER_NODE:-}
if [[ -z $workers_per_node ]]; then
  workers_name=$(slurm_name SLURM_NTASKS_PER_NODE 1)
  workers_per_node=1
  # A plain job's tasks per node describe the trainer ranks, not the workers.
  ((het)) && workers_per_node=${SLURM_NTASKS_PER_NODE_HET_GROUP_1:-1}
fi
check_int "$workers_name" "$workers_per_node" 1
workers_per_node=$((10#$workers_per_node))
num_workers=$((${#worker_nodes[@]} * workers_per_node))
if ((het)) && [[ -n ${SLURM_NTASKS_HET_GROUP_1:-} ]]; then
  check_int SLURM_NTASKS_HET_GROUP_1 "$SLURM_NTASKS_HET_GROUP_1" 1
  ((SLURM_NTASKS_HET_GROUP_1 == num_workers)) ||
    die "SLURM_NTASKS_HET_GROUP_1=$SLURM_NTASKS_HET_GROUP_1 tasks, but ${#worker_nodes[@]} worker node(s) x $workers_per_node per node ($workers_name) = $num_workers workers"
fi

trainer_cpus=${TRAINER_CPUS_PER_RANK:-$(slurm_var SLURM_CPUS_PER_TASK 0)}
[[ -z $trainer_cpus ]] || check_int TRAINER_CPUS_PER_RANK "$trainer_cpus" 1
worker_cpus=${WORKER_CPUS:-$(slurm_var SLURM_CPUS_PER_TASK 1)}
[[ -z $worker_cpus ]] || check_int WORKER_CPUS "$worker_cpus" 1
trainer_gpus=${TRAINER_GPUS_PER_NODE:-$(slurm_var SLURM_GPUS_PER_NODE 0)}
trainer_gpus=${trainer_gpus##*:} # --gpus-per-node=h100:4 -> 4
[[ -z $trainer_gpus ]] || check_int TRAINER_GPUS_PER_NODE "$trainer_gpus" 0
worker_gpus=${WORKER_GPUS:-0}
check_int WORKER_GPUS "$worker_gpus" 0

device=${RELAY_DEVICE:-}
worker_device=${RELAY_WORKER_DEVICE:-$device}
[[ $device =~ ^(|cpu|cuda)$ ]] || die "RELAY_DEVICE: must be cpu or cuda, got '$device'"
[[ $worker_device =~ ^(|cpu|cuda)$ ]] || die "RELAY_WORKER_DEVICE: must be cpu or cuda, got '$worker_device'"
if [[ $device == cuda && -n $trainer_gpus ]] && ((ranks_per_node > 10#$trainer_gpus)); then
  die "$ranks_name=$ranks_per_node trainer ranks per node, but TRAINER_GPUS_PER_NODE=$trainer_gpus: with RELAY_DEVICE=cuda each rank needs its own GPU"
fi
if [[ $worker_device == cuda ]] && ((workers_per_node > 1 && worker_gpus == 0)); then
  die "WORKER_GPUS=0 with $workers_per_node CUDA workers per node: they would all use the same GPU; set WORKER_GPUS=1"
fi

# ---------------------------------------------------------------- ports

port=${PORT:-50051}
master_port=${MASTER_PORT:-29500}
check_int PORT "$port" 1 65535
check_int MASTER_PORT "$master_port" 1 65535
reconnect_s=${RECONNECT_S:-600}
check_int RECONNECT_S "$reconnect_s" 0
# Everything rank 0 opens on MASTER_ADDR must be distinct.
declare -A port_owner=([$((10#$port))]=PORT)
claim_port() {
  local name=$1 value=$((10#$2))
  ((value == 0)) && return # 0 = any free port
  [[ -z ${port_owner[$value]:-} ]] ||
    die "$name=$2 is also ${port_owner[$value]}: rank 0 opens both on MASTER_ADDR"
  port_owner[$value]=$name
}
claim_port MASTER_PORT "$master_port"
if [[ -n ${WEIGHT_SYNC_PORT:-} ]]; then
  check_int WEIGHT_SYNC_PORT "$WEIGHT_SYNC_PORT" 0 65535
  claim_port WEIGHT_SYNC_PORT "$WEIGHT_SYNC_PORT"
fi
if [[ -n ${HTTP_LISTEN:-} ]]; then
  [[ $HTTP_LISTEN =~ :([0-9]+)$ ]] || die "HTTP_LISTEN: expected HOST:PORT, got '$HTTP_LISTEN'"
  http_port=${BASH_REMATCH[1]}
  check_int "HTTP_LISTEN's port" "$http_port" 0 65535
  claim_port HTTP_LISTEN "$http_port"
fi

# ---------------------------------------------------------------- commands

rank0_node=${trainer_nodes[0]}
master_addr=$rank0_node${TRAINER_HOST_SUFFIX:-}
common=()
if [[ -n ${RELAY_TOKEN_FILE:-} ]]; then
  common+=("services.token_file=$RELAY_TOKEN_FILE")
elif [[ -z ${RELAY_TOKEN:-} ]]; then
  note "neither RELAY_TOKEN nor RELAY_TOKEN_FILE is set: the gRPC services take unauthenticated calls unless the config sets services.token_file"
fi

trainer_overrides=("services.listen=0.0.0.0:$port" "trainer.world_size=$world_size"
  "trainer.rendezvous=$master_addr:$master_port")
[[ -z ${HTTP_LISTEN:-} ]] || trainer_overrides+=("services.http_listen=$HTTP_LISTEN")
[[ -z ${WEIGHT_SYNC_PORT:-} ]] || trainer_overrides+=("services.weight_sync_port=$WEIGHT_SYNC_PORT")
[[ -z $trainer_cpus ]] || trainer_overrides+=("run.threads=$trainer_cpus")
[[ -z $device ]] || trainer_overrides+=("run.device=$device")
trainer_overrides+=("${common[@]}" "${overrides[@]}")

worker_overrides=()
[[ -z $worker_cpus ]] || worker_overrides+=("run.threads=$worker_cpus")
[[ -z $worker_device ]] || worker_overrides+=("run.device=$worker_device")
worker_overrides+=("${common[@]}" "${overrides[@]}")

# One step for all trainer ranks, placed in blocks (ranks 0..R-1 on the first
# node) so that rank 0 lands on MASTER_ADDR. Every task sees all the node's
# GPUs and picks cuda:LOCAL_RANK, as under torchrun. The token is not here:
# --export=ALL carries RELAY_TOKEN from this environment.
trainer_cmd() {
  cmd=(srun)
  ((het)) && cmd+=(--het-group=0)
  cmd+=("--nodes=${#trainer_nodes[@]}" "--ntasks=$world_size" "--ntasks-per-node=$ranks_per_node"
    "--nodelist=$(join_by , "${trainer_nodes[@]}")" --distribution=block --kill-on-bad-exit=1)
  [[ -z $trainer_cpus ]] || cmd+=("--cpus-per-task=$trainer_cpus")
  [[ -z $trainer_gpus || $trainer_gpus == 0 ]] || cmd+=("--gpus-per-node=$trainer_gpus")
  cmd+=("--export=ALL,MASTER_ADDR=$master_addr,MASTER_PORT=$master_port,WORLD_SIZE=$world_size,RELAY_RANK0_NODE=$rank0_node"
    "$here/relay-rank.sh" "$RELAY_BIN/relay-trainer" "$CONFIG" --run-dir "$RUN_DIR"
    "${trainer_overrides[@]}" "${trainer_args[@]}")
}

# One step per worker, so that each has its own name and one that fails or
# is stopped leaves the others alone.
worker_cmd() {
  local node=$1 index=$2
  cmd=(srun)
  ((het)) && cmd+=(--het-group=1)
  cmd+=(--nodes=1 --ntasks=1 "--nodelist=$node")
  # Several steps on one node need --exact (Slurm >= 21.08), or the first
  # takes every CPU of the node and the others wait.
  ((workers_per_node > 1)) && cmd+=(--exact)
  [[ -z $worker_cpus ]] || cmd+=("--cpus-per-task=$worker_cpus")
  ((worker_gpus == 0)) || cmd+=("--gres=gpu:$worker_gpus")
  cmd+=("$RELAY_BIN/relay-rollout" "$CONFIG" --trainer "$master_addr:$port" --name "$node-$index"
    --reconnect-s "$reconnect_s" "${worker_overrides[@]}" "${worker_args[@]}")
}

restarts=${SLURM_RESTART_COUNT:-0}
log_dir=${LOG_DIR:-$RUN_DIR/logs}
trainer_log=$log_dir/trainer.${SLURM_JOB_ID:-local}.$restarts.log

if ((dry_run)); then
  echo "# trainer: $size_text; workers: ${#worker_nodes[@]} node(s) x $workers_per_node = $num_workers"
  echo "# MASTER_ADDR=$master_addr MASTER_PORT=$master_port PORT=$port"
  for ((r = 0; r < world_size; r++)); do
    echo "# trainer rank $r: node ${trainer_nodes[r / ranks_per_node]}, LOCAL_RANK $((r % ranks_per_node))"
  done
  if [[ -n ${RELAY_TOKEN:-} ]]; then
    echo "# RELAY_TOKEN: set; every step inherits it from the environment (srun --export=ALL)"
  fi
  echo "# trainer output: $trainer_log"
  print_cmd "$RELAY_BIN/relay" config check "$CONFIG" "${trainer_overrides[@]}"
  print_cmd "$RELAY_BIN/relay" config check "$CONFIG" "${worker_overrides[@]}"
  trainer_cmd
  print_cmd "${cmd[@]}"
  for node in "${worker_nodes[@]}"; do
    for ((i = 0; i < workers_per_node; i++)); do
      worker_cmd "$node" "$i"
      print_cmd "${cmd[@]}"
    done
  done
  exit 0
fi

# ---------------------------------------------------------------- the run

for f in relay relay-trainer relay-rollout; do
  [[ -x $RELAY_BIN/$f ]] || die "RELAY_BIN: $RELAY_BIN/$f is not an executable (build it, or point RELAY_BIN at the build's src/)"
done
[[ -r $CONFIG ]] || die "CONFIG: cannot read $CONFIG"
[[ -z ${RELAY_TOKEN_FILE:-} || -r $RELAY_TOKEN_FILE ]] || die "RELAY_TOKEN_FILE: cannot read $RELAY_TOKEN_FILE"
max_requeues=${MAX_REQUEUES:-20}
check_int MAX_REQUEUES "$max_requeues" 0
worker_stop_s=${WORKER_STOP_S:-60}
check_int WORKER_STOP_S "$worker_stop_s" 0

stop_signal=""
trainer_pid=""
worker_pids=()
# srun forwards SIGTERM to its tasks: relay-trainer's ranks finish the step
# and checkpoint (rank 0 decides), workers give their leases back.
# shellcheck disable=SC2317  # called from the traps below
on_signal() {
  stop_signal=$1
  note "SIG$1: stopping the trainer (it checkpoints) and the workers"
  [[ -z $trainer_pid ]] || kill -TERM "$trainer_pid" 2> /dev/null || true
  ((${#worker_pids[@]} == 0)) || kill -TERM "${worker_pids[@]}" 2> /dev/null || true
}
trap 'on_signal USR1' USR1
trap 'on_signal USR2' USR2

# A bad config fails here, in seconds, rather than in every step.
for check in trainer worker; do
  if [[ $check == trainer ]]; then o=("${trainer_overrides[@]}"); else o=("${worker_overrides[@]}"); fi
  out=$("$RELAY_BIN/relay" config check "$CONFIG" "${o[@]}" 2>&1) ||
    die "relay config check $CONFIG (the ${check}'s overrides) failed: $out"
done
[[ -z $stop_signal ]] || exit 0
mkdir -p "$log_dir"

note "trainer: $size_text on $(join_by , "${trainer_nodes[@]}"); MASTER_ADDR=$master_addr; output in $trainer_log"
trainer_cmd
"${cmd[@]}" > "$trainer_log" 2>&1 &
trainer_pid=$!
for node in "${worker_nodes[@]}"; do
  for ((i = 0; i < workers_per_node; i++)); do
    worker_cmd "$node" "$i"
    "${cmd[@]}" &
    worker_pids+=($!)
  done
done
note "workers: $num_workers on $(join_by , "${worker_nodes[@]}"), dialing $master_addr:$port"

# Waits for child $1; a trapped signal interrupts `wait` (status > 128) while
# the child runs on, so wait again until it has really exited.
wait_child() {
  local rc
  while :; do
    rc=0
    wait "$1" || rc=$?
    if ((rc > 128)) && kill -0 "$1" 2> /dev/null; then continue; fi
    return "$rc"
  done
}

trainer_rc=0
wait_child "$trainer_pid" || trainer_rc=$?
# Without a trainer the workers would only retry for --reconnect-s.
kill -TERM "${worker_pids[@]}" 2> /dev/null || true
deadline=$((SECONDS + 10#$worker_stop_s))
while ((SECONDS < deadline)); do
  alive=0
  for p in "${worker_pids[@]}"; do kill -0 "$p" 2> /dev/null && alive=1; done
  ((alive)) || break
  sleep 0.2
done

if grep -q '^done: ' "$trainer_log"; then
  note "the run finished: $(grep '^done: ' "$trainer_log" | tail -n 1)"
  exit 0
fi
if ! grep -q '^stopped: ' "$trainer_log"; then
  note "relay-trainer exited with status $trainer_rc before finishing or stopping cleanly; see $trainer_log"
  exit $((trainer_rc == 0 ? 1 : trainer_rc))
fi
note "the trainer stopped early: $(grep '^stopped: ' "$trainer_log" | tail -n 1)"
if [[ $stop_signal == USR2 ]]; then
  note "stopped on request (SIGUSR2): not requeued; submit the job again to resume"
  exit 0
fi
if [[ -z ${SLURM_JOB_ID:-} ]]; then
  note "not in a Slurm job (SLURM_JOB_ID unset): start again to resume"
  exit 0
fi
if ((restarts >= 10#$max_requeues)); then
  note "not requeued: the job has restarted $restarts times (MAX_REQUEUES=$max_requeues)"
  exit 1
fi
note "requeueing job $SLURM_JOB_ID; the next start resumes from the checkpoint just written"
scontrol requeue "$SLURM_JOB_ID" || die "scontrol requeue $SLURM_JOB_ID failed (the job needs --requeue)"
exit 0
