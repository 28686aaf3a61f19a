#pragma once

// How a relay process holds freed CPU memory (set once at startup by every
// relay binary; DESIGN.md, "Runtime choices").
//
// glibc's malloc maps each block above its mmap threshold (128 KiB rising
// to 32 MiB, or relay's old fixed 1 MiB) afresh and unmaps it when freed, so
// every training step faulted in, and the kernel zeroed, every page of its
// activations and gradients again: for a Qwen2.5-0.5B step on the CPU, a
// third of its time (docs/BENCHMARKS.md, "CPU memory: keeping freed
// blocks"). Kept, freed blocks stay in malloc's heap, where the next step's
// tensors reuse them, split and merged as their sizes need. The CUDA caching
// allocator does the same for GPU tensors.
//
// LibTorch's CPU tensors then come from relay's allocator: malloc, aligned
// by hand, because posix_memalign in Debian 12's glibc does not reuse the
// freed heap (src/model/cpu_memory.cc).

#include <cstdint>
#include <string>

#include "relay/common/status.h"

namespace relay::model {

enum class FreedMemory {
  // Every block comes from malloc's heap (no mmap per block) and the heap is
  // never trimmed: freed memory stays resident for reuse, a freed block
  // whole or split, merged with freed neighbours unless a live small
  // allocation lies between them. So the heap can fragment: a Qwen2.5-0.5B
  // training step peaked 2.5-5% higher than with kReturn. The resident set
  // does not shrink between steps. Exception: a thread other than the main
  // one has an arena of its own, which maps (and unmaps) each block larger
  // than its 64 MiB heaps whatever it is told; relay's binaries train and
  // decode on their main threads.
  kKeep,
  // Blocks of 1 MiB and more are mapped on allocation and unmapped when
  // freed, and the heap is trimmed above 8 MiB free: the resident set
  // follows what is in use, at the cost of page faults (relay's policy
  // before 2026-11-29; benchmarks compare the two).
  kReturn,
};

// Sets malloc's policy for this process, and with kKeep installs relay's
// allocator as LibTorch's CPU allocator (for good: tensors made before keep
// their own). Call at startup, before other threads start; calling it again
// is harmless.
void configure_cpu_memory(FreedMemory freed = FreedMemory::kKeep);

// The policy relay's binaries use: $RELAY_CPU_MEMORY, `keep` (the default,
// also when unset or empty) or `return`; anything else is an error naming
// the variable. The environment rather than the config: the policy must be
// set before any thread starts, and a supervisor's children inherit it.
StatusOr<FreedMemory> cpu_memory_from_env();

// `keep` or `return` (empty = keep); an error naming `where` otherwise.
StatusOr<FreedMemory> parse_freed_memory(const std::string& value, const std::string& where);

// configure_cpu_memory() with that policy; the error, with nothing set,
// when the variable holds something else.
Status configure_cpu_memory_from_env();

// Gives the freed memory malloc holds back to the system (malloc_trim):
// after a one-time peak whose memory nothing will reuse, such as loading a
// checkpoint in one dtype and converting it to another (a Qwen2.5-0.5B
// worker kept 2.3 GB of load-time buffers resident without it). Not in a
// loop: the next step would fault its pages in again.
void release_free_cpu_memory();

// Within its scope, blocks of 1 MiB and more are mapped and unmapped as
// with kReturn, then the process's policy is back; on entry, the freed
// memory malloc holds goes back to the system (release_free_cpu_memory).
// For one-off work whose big buffers nothing will reuse, and which grow by
// realloc (a mapped block grows by remapping, one in the heap by copying):
// under kKeep alone, writing a Qwen2.5-0.5B checkpoint (its 4 GB of AdamW
// state serialized into a string) took relay-trainer's peak from 14.9 to
// 22.4 GiB; with the scope but no release on entry, to 18.8 (the last
// step's freed temporaries, still resident). The next step faults its
// pages in again, once. Blocks allocated inside and freed later go back to
// the system too. One scope at a time.
class ReturnFreedMemoryScope {
 public:
  ReturnFreedMemoryScope();
  ~ReturnFreedMemoryScope();
  ReturnFreedMemoryScope(const ReturnFreedMemoryScope&) = delete;
  ReturnFreedMemoryScope& operator=(const ReturnFreedMemoryScope&) = delete;

 private:
  bool was_keep_;
};

struct CpuMemoryStats {
  bool known = false;        // false where malloc cannot say (another allocator or libc)
  int64_t in_use_bytes = 0;  // allocated and not freed (heap and mapped blocks)
  int64_t free_bytes = 0;    // freed and kept in malloc's heaps for reuse
  int64_t mapped_bytes = 0;  // of in_use_bytes, blocks with mappings of their own
};

// What malloc holds (glibc's mallinfo2: all arenas). Walks malloc's free
// lists: cheap once a step, not once a tensor.
CpuMemoryStats cpu_memory_stats();

}  // namespace relay::model
