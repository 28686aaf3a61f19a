#include "relay/model/core_share.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include <absl/strings/str_cat.h>
#include <spdlog/spdlog.h>

#include "relay/model/threads.h"

namespace relay::model {
namespace {

// One slot a cache line, so that one process's writes do not bounce the
// lines the others read. Written with atomic builtins: the file is shared
// memory between processes, where std::atomic members are not guaranteed
// lock-free and address-free.
struct alignas(64) Slot {
  int32_t pid;   // 0: free
  int32_t busy;  // 1: working
  char pad[56];
};
static_assert(sizeof(Slot) == 64, "a slot is one cache line");
constexpr size_t kFileBytes = sizeof(Slot) * CoreShare::kSlots;

Slot* slots(void* map) { return static_cast<Slot*>(map); }

bool alive(int32_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

}  // namespace

CoreShare::CoreShare(std::string path, void* map, int cores, int slot)
    : path_(std::move(path)), map_(map), cores_(cores), slot_(slot) {}

StatusOr<std::unique_ptr<CoreShare>> CoreShare::open(const std::string& path, int cores) {
  if (cores < 1) {
    return InvalidArgumentError(
        absl::StrCat("core share ", path, ": cores must be >= 1, got ", cores));
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return InternalError(
        absl::StrCat("core share ", path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return InternalError(absl::StrCat("core share ", path, ": cannot stat: ", std::strerror(e)));
  }
  // Processes starting together may all find it empty: extending to the
  // same size twice is harmless, and the new bytes read as zeros.
  if (st.st_size == 0 && ::ftruncate(fd, kFileBytes) != 0) {
    const int e = errno;
    ::close(fd);
    return InternalError(absl::StrCat("core share ", path, ": cannot size: ", std::strerror(e)));
  }
  if (st.st_size != 0 && static_cast<size_t>(st.st_size) != kFileBytes) {
    ::close(fd);
    return InvalidArgumentError(absl::StrCat("core share ", path, ": ", st.st_size,
                                             " bytes where a core share has ", kFileBytes,
                                             " (another program's file?)"));
  }
  void* map = ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    return InternalError(
        absl::StrCat("core share ", path, ": cannot map: ", std::strerror(map_errno)));
  }
  const int32_t me = static_cast<int32_t>(::getpid());
  for (int i = 0; i < kSlots; ++i) {
    Slot& s = slots(map)[i];
    // A slot of this pid is another share this process opened.
    int32_t held = __atomic_load_n(&s.pid, __ATOMIC_ACQUIRE);
    if (held != 0 && (held == me || alive(held))) continue;
    if (!__atomic_compare_exchange_n(&s.pid, &held, me, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
      continue;  // another process claimed it first
    }
    __atomic_store_n(&s.busy, 1, __ATOMIC_RELEASE);
    return std::unique_ptr<CoreShare>(new CoreShare(path, map, cores, i));
  }
  ::munmap(map, kFileBytes);
  return absl::ResourceExhaustedError(
      absl::StrCat("core share ", path, ": all ", kSlots, " slots are held by live processes"));
}

CoreShare::~CoreShare() {
  Slot& s = slots(map_)[slot_];
  __atomic_store_n(&s.busy, 0, __ATOMIC_RELEASE);
  __atomic_store_n(&s.pid, 0, __ATOMIC_RELEASE);
  ::munmap(map_, kFileBytes);
}

void CoreShare::set_busy(bool busy) {
  busy_ = busy;
  __atomic_store_n(&slots(map_)[slot_].busy, busy ? 1 : 0, __ATOMIC_RELEASE);
}

int CoreShare::busy_processes() const {
  int n = 0;
  for (int i = 0; i < kSlots; ++i) {
    const Slot& s = slots(map_)[i];
    if (__atomic_load_n(&s.busy, __ATOMIC_ACQUIRE) == 0) continue;
    if (i == slot_ || alive(__atomic_load_n(&s.pid, __ATOMIC_ACQUIRE))) ++n;
  }
  return n;
}

int CoreShare::share() const {
  const int others = busy_processes() - (busy_ ? 1 : 0);
  return std::max(1, cores_ / (others + 1));
}

// ---------------------------------------------------------------------------
// The process's share.

namespace {

struct Installed {
  std::mutex mutex;  // the share and the threads applied
  std::unique_ptr<CoreShare> share;
  int applied = 0;  // threads configure_threads was last given
  std::atomic<bool> any{false};
  std::atomic<int64_t> next_read_ns{0};
};

Installed& installed() {
  static Installed* i = new Installed();  // never destroyed: used from any thread at exit
  return *i;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Under the mutex: the share's threads, applied when they changed.
void apply_locked(Installed& in) {
  const int want = in.share->share();
  if (want == in.applied) return;
  spdlog::debug("core share {}: {} busy process(es) of {} cores: {} -> {} threads",
                in.share->path(), in.share->busy_processes(), in.share->cores(), in.applied, want);
  configure_threads(want);
  in.applied = want;
}

}  // namespace

void install_core_share(std::unique_ptr<CoreShare> share) {
  Installed& in = installed();
  std::lock_guard<std::mutex> lock(in.mutex);
  in.share = std::move(share);
  in.applied = 0;
  in.any.store(in.share != nullptr, std::memory_order_release);
  if (in.share) apply_locked(in);
}

CoreShare* installed_core_share() {
  Installed& in = installed();
  std::lock_guard<std::mutex> lock(in.mutex);
  return in.share.get();
}

int core_share_threads() {
  Installed& in = installed();
  std::lock_guard<std::mutex> lock(in.mutex);
  return in.share ? in.applied : 0;
}

void cores_busy(bool busy) {
  Installed& in = installed();
  if (!in.any.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(in.mutex);
  if (!in.share || in.share->busy() == busy) return;
  in.share->set_busy(busy);
  // Starting work: take the share now, not at the first safe point.
  if (busy) apply_locked(in);
}

void refresh_cores() {
  Installed& in = installed();
  if (!in.any.load(std::memory_order_acquire)) return;
  const int64_t now = now_ns();
  if (now < in.next_read_ns.load(std::memory_order_relaxed)) return;
  in.next_read_ns.store(now + 10'000'000, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(in.mutex);
  if (in.share && in.share->busy()) apply_locked(in);
}

}  // namespace relay::model
