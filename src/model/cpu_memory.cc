#include "relay/model/cpu_memory.h"

#include <malloc.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

// LibTorch 2.3 made Allocator::allocate non-const and added copy_data.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define RELAY_ALLOCATOR_2_3 1
#define RELAY_ALLOCATE_CONST
#else
#define RELAY_ALLOCATOR_2_3 0
#define RELAY_ALLOCATE_CONST const
#endif

namespace relay::model {
namespace {

// LibTorch's CPU tensors from malloc, aligned by hand. LibTorch's own
// allocator calls posix_memalign(64), which in Debian 12's glibc (2.36)
// does not reuse freed chunks it could: a loop that frees eight 32 MiB
// blocks and allocates them again grew the heap by 32 MiB on its second
// pass and 224 MiB on its third, where malloc grew it by nothing (with
// mmap and trimming off both times). Each block is malloc'd 64 bytes
// larger; the pointer malloc gave sits in the 8 bytes before the aligned
// data, and the data is the DataPtr's context too, as LibTorch's are, so
// raw_allocate and raw_deleter work.
class HeapCpuAllocator final : public c10::Allocator {
 public:
  static constexpr uintptr_t kAlignment = 64;  // c10's gAlignment

  c10::DataPtr allocate(size_t n) RELAY_ALLOCATE_CONST override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return {nullptr, nullptr, &HeapCpuAllocator::free_block, cpu};
    void* base = std::malloc(n + kAlignment);
    TORCH_CHECK(base != nullptr, "relay CPU allocator: out of memory: tried to allocate ", n,
                " bytes");
    const uintptr_t data =
        (reinterpret_cast<uintptr_t>(base) + sizeof(void*) + kAlignment - 1) & ~(kAlignment - 1);
    void* p = reinterpret_cast<void*>(data);
    static_cast<void**>(p)[-1] = base;
    return {p, p, &HeapCpuAllocator::free_block, cpu};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &HeapCpuAllocator::free_block; }

#if RELAY_ALLOCATOR_2_3
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

 private:
  static void free_block(void* p) {
    if (p != nullptr) std::free(static_cast<void**>(p)[-1]);
  }
};

std::once_flag g_install;
std::atomic<bool> g_keep{false};  // the policy configure_cpu_memory set last

void apply(FreedMemory freed) {
#ifdef __GLIBC__
  switch (freed) {
    case FreedMemory::kKeep:
      mallopt(M_MMAP_MAX, 0);
      mallopt(M_TRIM_THRESHOLD, -1);
      break;
    case FreedMemory::kReturn:
      // A fixed threshold also turns off glibc's dynamic one, which would
      // keep blocks up to 32 MiB in its heap.
      mallopt(M_MMAP_MAX, 65536);  // glibc's default
      mallopt(M_MMAP_THRESHOLD, 1 << 20);
      mallopt(M_TRIM_THRESHOLD, 8 << 20);
      break;
  }
#else
  (void)freed;
#endif
}

}  // namespace

void configure_cpu_memory(FreedMemory freed) {
  // kKeep: no block gets a mapping of its own and the heap is never trimmed
  // (-1). A thread other than the main one allocates from an arena of its
  // own, which maps every block larger than its 64 MiB heaps whatever
  // M_MMAP_MAX says. One arena for all threads would keep those too, but
  // cost concurrent gRPC ingest 10-16% (ingest_bench, 4 clients): relay's
  // binaries train and decode on their main threads.
  apply(freed);
  g_keep = freed == FreedMemory::kKeep;
  if (freed == FreedMemory::kKeep) {
    std::call_once(g_install, [] {
      // Never destroyed: tensors freed during static destruction still call
      // its deleter.
      c10::SetCPUAllocator(new HeapCpuAllocator(), /*priority=*/1);
    });
  }
}

ReturnFreedMemoryScope::ReturnFreedMemoryScope() : was_keep_(g_keep.load()) {
  if (!was_keep_) return;
  apply(FreedMemory::kReturn);
  // And what the heap holds freed: resident beside the one-off buffers, it
  // would add the last step's temporaries to their peak.
  release_free_cpu_memory();
}

ReturnFreedMemoryScope::~ReturnFreedMemoryScope() {
  if (was_keep_) apply(FreedMemory::kKeep);
}

StatusOr<FreedMemory> parse_freed_memory(const std::string& value, const std::string& where) {
  if (value.empty() || value == "keep") return FreedMemory::kKeep;
  if (value == "return") return FreedMemory::kReturn;
  return InvalidArgumentError(where + ": '" + value + "' is not keep or return");
}

StatusOr<FreedMemory> cpu_memory_from_env() {
  const char* v = std::getenv("RELAY_CPU_MEMORY");
  return parse_freed_memory(v ? v : "", "RELAY_CPU_MEMORY");
}

Status configure_cpu_memory_from_env() {
  RELAY_ASSIGN_OR_RETURN(const FreedMemory freed, cpu_memory_from_env());
  configure_cpu_memory(freed);
  return OkStatus();
}

void release_free_cpu_memory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

CpuMemoryStats cpu_memory_stats() {
  CpuMemoryStats s;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 m = mallinfo2();
  s.known = true;
  s.in_use_bytes = static_cast<int64_t>(m.uordblks + m.hblkhd);
  s.free_bytes = static_cast<int64_t>(m.fordblks);
  s.mapped_bytes = static_cast<int64_t>(m.hblkhd);
#endif
  return s;
}

}  // namespace relay::model
