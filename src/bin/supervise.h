#pragma once

// What `relay run` decides about its child processes, as pure functions so
// that the decisions can be tested without starting any: how a child ended,
// told the way a person reads it (a SIGKILL from the kernel is most often the
// out-of-memory killer, and the peak RSS says how much it had), and when a
// worker that keeps dying is not started again.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace relay::cli {

// How a child process ended, from wait4()'s status and resource usage.
struct ChildExit {
  bool signaled = false;  // killed by a signal; otherwise it exited
  int code = 0;           // the exit code, or the signal's number when signaled
  // The child's peak resident set size (rusage.ru_maxrss, KiB, which Linux
  // reports for a reaped child); 0 = unknown.
  int64_t max_rss_kib = 0;
  // relay run sent the SIGKILL itself because the child did not stop in
  // time after SIGTERM: not the kernel's doing, so not out of memory.
  bool killed_by_supervisor = false;
};

// From a wait status (WIFEXITED / WIFSIGNALED) and rusage.ru_maxrss.
ChildExit child_exit(int wait_status, int64_t max_rss_kib);

// The number a shell reports for it: the exit code, or 128 + the signal
// (137 for SIGKILL). `relay run` exits with the trainer's.
int shell_code(const ChildExit& e);

// "SIGKILL", "SIGSEGV", ...; "signal 42" for one without a name here.
std::string signal_name(int signal);

// "17.9 GiB", "212.4 MiB", "900 KiB"; "unknown" for 0.
std::string format_rss(int64_t kib);

// How it ended, to follow "relay run: worker local0 ":
//   exited with 3
//   was killed by SIGKILL (probably out of memory: peak RSS 17.9 GiB; see ...)
//   was killed by SIGSEGV (segmentation fault; peak RSS 1.2 GiB)
std::string describe_exit(const ChildExit& e);

// The same in a few words, for a sentence about several deaths:
// "killed by SIGKILL, probably out of memory, peak RSS 17.9 GiB", "exit code 3".
std::string describe_exit_briefly(const ChildExit& e);

// Same signal, or same exit code.
bool same_way(const ChildExit& a, const ChildExit& b);

// When relay run stops restarting a worker.
struct RestartPolicy {
  // Restarts of one worker in all (healthy runs between them or not).
  int max_restarts = 20;
  // Deaths in a row the same way (same signal or same exit code) after which
  // the worker stays down: a worker the kernel kills for memory at every
  // start will be killed at the next one too, and restarting it 20 times
  // only delays the failure by minutes.
  int max_same_in_a_row = 3;
  // A worker that ran at least this long before it died was healthy: its
  // death starts a new row. A row is the deaths since the last healthy run
  // (or the start) that all ended the same way.
  std::chrono::milliseconds healthy_uptime{std::chrono::seconds(60)};
};

// One worker's deaths so far, as record_death() counts them.
struct DeathRecord {
  int restarts = 0;       // restarts granted
  int same_in_a_row = 0;  // length of the current row (0 before any death)
  ChildExit last;         // the latest death
  bool given_up = false;  // the worker stays down
};

enum class RestartDecision {
  kRestart,        // start it again after restart_backoff(restarts - 1)
  kGiveUpSameWay,  // max_same_in_a_row deaths in a row the same way
  kGiveUpTooMany,  // max_restarts restarts spent
};

// Records a worker's death (a non-zero exit or a signal) after `uptime` of
// running and says what to do; a kRestart counts as one more restart.
RestartDecision record_death(DeathRecord& record, const ChildExit& death,
                             std::chrono::milliseconds uptime, const RestartPolicy& policy);

// The wait before restart number `restart` (from 0): 1, 2, 4, 8, 16, 30,
// 30 ... s, so that a worker that cannot start does not spin.
std::chrono::seconds restart_backoff(int restart);

// Why a worker is not restarted, to follow "worker local0 ":
// "died the same way 3 times in a row", "was restarted 20 times already";
// describe_exit_briefly(record.last) says how.
std::string give_up_reason(RestartDecision decision, const DeathRecord& record,
                           const RestartPolicy& policy);

// Where each rollout worker of relay run stands.
enum class WorkerState {
  kRunning,
  kRestarting,  // dead, to be started again after its backoff
  kFinished,    // exited 0: told to stop, or the run is over
  kGivenUp,     // dead and not to be started again
};

// Whether relay run has given up on every rollout worker: then the trainer
// would only wait for groups that cannot come. A worker that exited 0 heard
// that the run is finished (or lost its trainer for good): the trainer is
// ending by itself then, and is left to finish.
bool every_worker_gone(const std::vector<WorkerState>& workers);

}  // namespace relay::cli
