#include "bin/supervise.h"

#include <sys/wait.h>

#include <algorithm>
#include <csignal>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace relay::cli {
namespace {

// Where the message about a SIGKILL sends people.
constexpr char kOutOfMemoryDoc[] = "see docs/services.md, \"When a child process dies\"";

struct SignalText {
  int signal;
  const char* name;
  const char* meaning;  // strsignal()'s words, lower-case
};

// A fixed table rather than strsignal()/sigabbrev_np(): the same words on
// every libc, and the tests can say what they expect.
constexpr SignalText kSignals[] = {
    {SIGHUP, "SIGHUP", "hangup"},
    {SIGINT, "SIGINT", "interrupt"},
    {SIGQUIT, "SIGQUIT", "quit"},
    {SIGILL, "SIGILL", "illegal instruction"},
    {SIGTRAP, "SIGTRAP", "trace/breakpoint trap"},
    {SIGABRT, "SIGABRT", "aborted"},
    {SIGBUS, "SIGBUS", "bus error"},
    {SIGFPE, "SIGFPE", "floating point exception"},
    {SIGKILL, "SIGKILL", "killed"},
    {SIGUSR1, "SIGUSR1", "user defined signal 1"},
    {SIGSEGV, "SIGSEGV", "segmentation fault"},
    {SIGUSR2, "SIGUSR2", "user defined signal 2"},
    {SIGPIPE, "SIGPIPE", "broken pipe"},
    {SIGALRM, "SIGALRM", "alarm clock"},
    {SIGTERM, "SIGTERM", "terminated"},
    {SIGXCPU, "SIGXCPU", "CPU time limit exceeded"},
    {SIGXFSZ, "SIGXFSZ", "file size limit exceeded"},
    {SIGSYS, "SIGSYS", "bad system call"},
};

const SignalText* find_signal(int signal) {
  for (const SignalText& s : kSignals) {
    if (s.signal == signal) return &s;
  }
  return nullptr;
}

// A SIGKILL nobody in relay sent: on Linux almost always the kernel's
// out-of-memory killer (or a cgroup's memory limit), which says so only in
// the kernel log.
bool probably_out_of_memory(const ChildExit& e) {
  return e.signaled && e.code == SIGKILL && !e.killed_by_supervisor;
}

}  // namespace

ChildExit child_exit(int wait_status, int64_t max_rss_kib) {
  ChildExit e;
  e.max_rss_kib = std::max<int64_t>(0, max_rss_kib);
  if (WIFSIGNALED(wait_status)) {
    e.signaled = true;
    e.code = WTERMSIG(wait_status);
  } else if (WIFEXITED(wait_status)) {
    e.code = WEXITSTATUS(wait_status);
  }
  return e;
}

int shell_code(const ChildExit& e) { return e.signaled ? 128 + e.code : e.code; }

std::string signal_name(int signal) {
  const SignalText* s = find_signal(signal);
  return s != nullptr ? s->name : absl::StrCat("signal ", signal);
}

std::string format_rss(int64_t kib) {
  if (kib <= 0) return "unknown";
  if (kib >= int64_t{1} << 20) return absl::StrFormat("%.1f GiB", kib / 1048576.0);
  if (kib >= int64_t{1} << 10) return absl::StrFormat("%.1f MiB", kib / 1024.0);
  return absl::StrCat(kib, " KiB");
}

std::string describe_exit(const ChildExit& e) {
  if (!e.signaled) return absl::StrCat("exited with ", e.code);
  const std::string killed = absl::StrCat("was killed by ", signal_name(e.code));
  if (e.killed_by_supervisor) return absl::StrCat(killed, " (it did not stop after SIGTERM)");
  if (probably_out_of_memory(e)) {
    const std::string peak =
        e.max_rss_kib > 0 ? absl::StrCat(": peak RSS ", format_rss(e.max_rss_kib)) : "";
    return absl::StrCat(killed, " (probably out of memory", peak, "; ", kOutOfMemoryDoc, ")");
  }
  const SignalText* s = find_signal(e.code);
  std::string why = s != nullptr ? s->meaning : "";
  if (e.max_rss_kib > 0) {
    absl::StrAppend(&why, why.empty() ? "" : "; ", "peak RSS ", format_rss(e.max_rss_kib));
  }
  return why.empty() ? killed : absl::StrCat(killed, " (", why, ")");
}

std::string describe_exit_briefly(const ChildExit& e) {
  if (!e.signaled) return absl::StrCat("exit code ", e.code);
  std::string out = absl::StrCat("killed by ", signal_name(e.code));
  if (probably_out_of_memory(e)) out += ", probably out of memory";
  if (e.max_rss_kib > 0) absl::StrAppend(&out, ", peak RSS ", format_rss(e.max_rss_kib));
  return out;
}

bool same_way(const ChildExit& a, const ChildExit& b) {
  return a.signaled == b.signaled && a.code == b.code;
}

RestartDecision record_death(DeathRecord& record, const ChildExit& death,
                             std::chrono::milliseconds uptime, const RestartPolicy& policy) {
  const bool continues_row =
      record.same_in_a_row > 0 && same_way(record.last, death) && uptime < policy.healthy_uptime;
  record.same_in_a_row = continues_row ? record.same_in_a_row + 1 : 1;
  record.last = death;
  if (record.same_in_a_row >= policy.max_same_in_a_row) {
    record.given_up = true;
    return RestartDecision::kGiveUpSameWay;
  }
  if (record.restarts >= policy.max_restarts) {
    record.given_up = true;
    return RestartDecision::kGiveUpTooMany;
  }
  ++record.restarts;
  return RestartDecision::kRestart;
}

std::chrono::seconds restart_backoff(int restart) {
  return std::chrono::seconds(std::min(30, 1 << std::clamp(restart, 0, 5)));
}

std::string give_up_reason(RestartDecision decision, const DeathRecord& record,
                           const RestartPolicy& policy) {
  switch (decision) {
    case RestartDecision::kGiveUpSameWay:
      return absl::StrCat("died the same way ", record.same_in_a_row, " times in a row");
    case RestartDecision::kGiveUpTooMany:
      return absl::StrCat("was restarted ", policy.max_restarts, " times already");
    case RestartDecision::kRestart:
      break;
  }
  return "";
}

bool every_worker_gone(const std::vector<WorkerState>& workers) {
  if (workers.empty()) return false;
  return std::all_of(workers.begin(), workers.end(),
                     [](WorkerState w) { return w == WorkerState::kGivenUp; });
}

}  // namespace relay::cli
