#pragma once

// The cores of one machine shared by the processes of a run on it, by who is
// working at the moment (run.core_share; `relay run` sets it when run.threads
// is 0).
//
// A fixed split (cores / processes) leaves cores idle through each phase of
// an RL step: the trainer trains while its workers wait for its next version,
// and they decode while it waits for their groups. On 2 cores a 0.5B trainer
// then trains on one thread while the other core sleeps (docs/rollout.md,
// "Threads"). Here each process marks itself busy or waiting in a small
// shared file, and a busy process runs on cores / (busy processes) threads,
// re-read at its safe points (before a decode step, and before each layer of
// a forward or backward pass): alone it gets the machine, overlapping it
// gets its share, at least one thread (a process holds its count until its
// next safe point). OpenBLAS's threads would spin ~0.1 s on cores given up;
// relay run sets OPENBLAS_THREAD_TIMEOUT for its processes so that they
// sleep at once (bin/run_command.cc).
//
// The file holds kSlots slots of one cache line each: a process claims one
// whose pid is 0 or whose process is gone (kill(pid, 0)), so a crashed
// process's slot goes back to the run, and a busy slot whose process is gone
// is not counted. The processes must share a pid namespace (one machine).

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "relay/common/status.h"

namespace relay::model {

class CoreShare {
 public:
  static constexpr int kSlots = 64;

  // Maps `path` (created, zero-filled, when missing) and claims a slot for
  // this process, busy. `cores` >= 1: the cores the busy processes divide.
  // Errors name the file: cannot open or map it, a file of another size, or
  // every slot held by a live process.
  static StatusOr<std::unique_ptr<CoreShare>> open(const std::string& path, int cores);
  ~CoreShare();  // gives the slot back
  CoreShare(const CoreShare&) = delete;
  CoreShare& operator=(const CoreShare&) = delete;

  void set_busy(bool busy);
  bool busy() const { return busy_; }
  // Processes marked busy whose process is alive, this one included when
  // it is busy.
  int busy_processes() const;
  // The threads a busy process of this share runs on now:
  // max(1, cores / busy processes), this one counted as busy.
  int share() const;
  int cores() const { return cores_; }
  int slot() const { return slot_; }
  const std::string& path() const { return path_; }

 private:
  CoreShare(std::string path, void* map, int cores, int slot);

  std::string path_;
  void* map_ = nullptr;
  int cores_ = 1;
  int slot_ = -1;
  bool busy_ = true;
};

// The process's share, for the threads configure_threads set: installed
// once at start-up (app/setup.cc), then followed by the calls below, which do
// nothing without one.
void install_core_share(std::unique_ptr<CoreShare> share);
CoreShare* installed_core_share();
// The threads the installed share last gave configure_threads; 0 without one.
int core_share_threads();

// Marks this process busy or waiting; busy re-divides the cores at once.
void cores_busy(bool busy);

// At a safe point (between tensor operations, on the thread that runs them):
// when the busy processes changed, this process's threads follow its share
// (OpenBLAS's pool and relay's kernel pool, or LibTorch's intra-op pool).
// Reads the file at most every 10 ms; otherwise an atomic load and a clock
// read.
void refresh_cores();

// Marks this process waiting for as long as it lives (a trainer waiting for
// groups, a worker waiting for a version), busy again after.
class CoresWaiting {
 public:
  CoresWaiting() { cores_busy(false); }
  ~CoresWaiting() { cores_busy(true); }
  CoresWaiting(const CoresWaiting&) = delete;
  CoresWaiting& operator=(const CoresWaiting&) = delete;
};

}  // namespace relay::model
