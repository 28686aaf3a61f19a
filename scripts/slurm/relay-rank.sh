#!/usr/bin/env bash
# relay-rank.sh COMMAND [ARGS...]: the per-task wrapper of the trainer's srun
# step (relay-launch.sh puts it in front of relay-trainer).
#
# srun starts one identical command per task; relay-trainer wants torchrun's
# variables instead of Slurm's. This exports
#   RANK       = SLURM_PROCID   (0 .. WORLD_SIZE-1 over the whole step)
#   LOCAL_RANK = SLURM_LOCALID  (the task's index on its node: cuda:LOCAL_RANK)
# and execs COMMAND, so signals from srun reach relay-trainer directly.
# WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the step's environment
# (srun --export); RELAY_RANK0_NODE, when set, is the node rank 0 must run on.
set -euo pipefail

fail() {
  echo "relay-rank.sh: $*" >&2
  exit 2
}

[[ $# -gt 0 ]] || fail "usage: relay-rank.sh COMMAND [ARGS...]"
[[ ${SLURM_PROCID:-} =~ ^[0-9]+$ ]] ||
  fail "SLURM_PROCID: not set or not a number ('${SLURM_PROCID:-}'); start this under srun"
[[ ${SLURM_LOCALID:-} =~ ^[0-9]+$ ]] ||
  fail "SLURM_LOCALID: not set or not a number ('${SLURM_LOCALID:-}'); start this under srun"
[[ ${WORLD_SIZE:-} =~ ^[1-9][0-9]*$ ]] ||
  fail "WORLD_SIZE: not set or not a positive number ('${WORLD_SIZE:-}')"
((SLURM_PROCID < WORLD_SIZE)) ||
  fail "SLURM_PROCID=$SLURM_PROCID is not below WORLD_SIZE=$WORLD_SIZE: the step has more tasks than trainer ranks"

# Rank 0 opens the rendezvous store on MASTER_ADDR and serves the workers
# there. Were it placed on another node, every other process would wait on
# the wrong host until its timeout; failing here names the cause at once.
if ((SLURM_PROCID == 0)) && [[ -n ${RELAY_RANK0_NODE:-} && -n ${SLURMD_NODENAME:-} &&
  $SLURMD_NODENAME != "$RELAY_RANK0_NODE" ]]; then
  fail "rank 0 started on $SLURMD_NODENAME, but MASTER_ADDR points at $RELAY_RANK0_NODE (the first trainer node)"
fi

export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID
exec "$@"
