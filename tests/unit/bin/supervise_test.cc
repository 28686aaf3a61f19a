#include "bin/supervise.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <csignal>
#include <string>
#include <vector>

namespace relay::cli {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Wait statuses as the kernel builds them (W_EXITCODE is glibc's own macro).
int exited(int code) { return W_EXITCODE(code, 0); }
int killed(int signal) { return W_EXITCODE(0, signal); }

ChildExit exit_code(int code) { return child_exit(exited(code), 0); }
ChildExit by_signal(int sig, int64_t rss_kib = 0) { return child_exit(killed(sig), rss_kib); }

TEST(SuperviseTest, ChildExitFromAWaitStatus) {
  struct Case {
    int status;
    int64_t rss;
    bool signaled;
    int code;
    int shell;
  };
  const Case cases[] = {
      {exited(0), 100, false, 0, 0},
      {exited(3), 100, false, 3, 3},
      {exited(137), 100, false, 137, 137},  // exit(137) is an exit, not a kill
      {killed(SIGKILL), 18769101, true, SIGKILL, 137},
      {killed(SIGSEGV), 5, true, SIGSEGV, 139},
      {killed(SIGABRT), -1, true, SIGABRT, 134},
  };
  for (const Case& c : cases) {
    const ChildExit e = child_exit(c.status, c.rss);
    EXPECT_EQ(e.signaled, c.signaled) << c.status;
    EXPECT_EQ(e.code, c.code) << c.status;
    EXPECT_EQ(shell_code(e), c.shell) << c.status;
    EXPECT_EQ(e.max_rss_kib, c.rss < 0 ? 0 : c.rss) << c.status;
    EXPECT_FALSE(e.killed_by_supervisor);
  }
}

TEST(SuperviseTest, DescribesEachWayOfDying) {
  ChildExit by_us = by_signal(SIGKILL, 2048);
  by_us.killed_by_supervisor = true;
  const std::string see = "see docs/services.md, \"When a child process dies\"";
  struct Case {
    ChildExit e;
    std::string full, brief;
  };
  const Case cases[] = {
      {exit_code(3), "exited with 3", "exit code 3"},
      // 17.9 GiB in KiB, as ru_maxrss reports it: the user report's worker.
      {by_signal(SIGKILL, 18769101),
       "was killed by SIGKILL (probably out of memory: peak RSS 17.9 GiB; " + see + ")",
       "killed by SIGKILL, probably out of memory, peak RSS 17.9 GiB"},
      {by_signal(SIGKILL), "was killed by SIGKILL (probably out of memory; " + see + ")",
       "killed by SIGKILL, probably out of memory"},
      {by_us, "was killed by SIGKILL (it did not stop after SIGTERM)",
       "killed by SIGKILL, peak RSS 2.0 MiB"},
      {by_signal(SIGSEGV, 1258291), "was killed by SIGSEGV (segmentation fault; peak RSS 1.2 GiB)",
       "killed by SIGSEGV, peak RSS 1.2 GiB"},
      {by_signal(SIGABRT), "was killed by SIGABRT (aborted)", "killed by SIGABRT"},
      {by_signal(SIGTERM, 900), "was killed by SIGTERM (terminated; peak RSS 900 KiB)",
       "killed by SIGTERM, peak RSS 900 KiB"},
      {by_signal(42), "was killed by signal 42", "killed by signal 42"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(describe_exit(c.e), c.full);
    EXPECT_EQ(describe_exit_briefly(c.e), c.brief);
  }
}

TEST(SuperviseTest, FormatsPeakRss) {
  EXPECT_EQ(format_rss(0), "unknown");
  EXPECT_EQ(format_rss(1023), "1023 KiB");
  EXPECT_EQ(format_rss(1024), "1.0 MiB");
  EXPECT_EQ(format_rss(217498), "212.4 MiB");
  EXPECT_EQ(format_rss(1048576), "1.0 GiB");
}

TEST(SuperviseTest, SameWayIsTheSameSignalOrTheSameExitCode) {
  EXPECT_TRUE(same_way(by_signal(SIGKILL, 10), by_signal(SIGKILL, 99)));  // peak RSS aside
  EXPECT_FALSE(same_way(by_signal(SIGKILL), by_signal(SIGSEGV)));
  EXPECT_TRUE(same_way(exit_code(1), exit_code(1)));
  EXPECT_FALSE(same_way(exit_code(1), exit_code(2)));
  EXPECT_FALSE(same_way(exit_code(9), by_signal(9)));  // exit(9) is not SIGKILL
}

// A worker's deaths one after another: what each one decides.
struct Death {
  ChildExit how;
  milliseconds uptime;
  RestartDecision want;
  int row;  // same_in_a_row after it
};

void expect_deaths(const std::vector<Death>& deaths, const RestartPolicy& policy = {}) {
  DeathRecord r;
  for (size_t i = 0; i < deaths.size(); ++i) {
    const Death& d = deaths[i];
    EXPECT_EQ(record_death(r, d.how, d.uptime, policy), d.want) << "death " << i;
    EXPECT_EQ(r.same_in_a_row, d.row) << "death " << i;
  }
}

constexpr auto kRestart = RestartDecision::kRestart;
constexpr auto kSameWay = RestartDecision::kGiveUpSameWay;
constexpr auto kTooMany = RestartDecision::kGiveUpTooMany;

TEST(SuperviseTest, ThreeDeathsInARowTheSameWayStopTheRestarts) {
  const ChildExit oom = by_signal(SIGKILL, 18769101);
  expect_deaths({{oom, seconds(5), kRestart, 1},
                 {oom, seconds(5), kRestart, 2},
                 {oom, seconds(5), kSameWay, 3}});
  expect_deaths({{exit_code(1), seconds(1), kRestart, 1},
                 {exit_code(1), seconds(1), kRestart, 2},
                 {exit_code(1), seconds(1), kSameWay, 3}});
}

TEST(SuperviseTest, ADifferentDeathStartsANewRow) {
  const ChildExit oom = by_signal(SIGKILL);
  expect_deaths({{oom, seconds(5), kRestart, 1},
                 {oom, seconds(5), kRestart, 2},
                 {by_signal(SIGSEGV), seconds(5), kRestart, 1},
                 {oom, seconds(5), kRestart, 1},
                 {oom, seconds(5), kRestart, 2},
                 {exit_code(1), seconds(5), kRestart, 1},
                 {exit_code(2), seconds(5), kRestart, 1}});
}

// A worker that ran for a minute before it died was working: the next death
// starts a row of its own, so a long run that loses a worker now and then
// keeps it.
TEST(SuperviseTest, AHealthyRunBetweenDeathsResetsTheRow) {
  const ChildExit oom = by_signal(SIGKILL);
  expect_deaths({{oom, seconds(5), kRestart, 1},
                 {oom, seconds(5), kRestart, 2},
                 {oom, seconds(60), kRestart, 1},  // up for healthy_uptime: a new row
                 {oom, seconds(59), kRestart, 2},
                 {oom, seconds(600), kRestart, 1},
                 {oom, milliseconds(100), kRestart, 2},
                 {oom, milliseconds(100), kSameWay, 3}});
}

TEST(SuperviseTest, TheOverallCapStillHolds) {
  RestartPolicy p;
  p.max_restarts = 3;
  expect_deaths({{exit_code(1), seconds(1), kRestart, 1},
                 {exit_code(2), seconds(1), kRestart, 1},
                 {exit_code(1), seconds(1), kRestart, 1},
                 {exit_code(2), seconds(1), kTooMany, 1}},
                p);
}

TEST(SuperviseTest, GiveUpReasons) {
  DeathRecord r;
  const RestartPolicy p;
  for (int i = 0; i < 3; ++i) record_death(r, by_signal(SIGKILL, 18769101), seconds(1), p);
  EXPECT_EQ(give_up_reason(kSameWay, r, p), "died the same way 3 times in a row");
  EXPECT_EQ(give_up_reason(kTooMany, r, p), "was restarted 20 times already");
  EXPECT_EQ(give_up_reason(kRestart, r, p), "");
}

TEST(SuperviseTest, BacksOffOneTwoFourUpToThirtySeconds) {
  const int want[] = {1, 2, 4, 8, 16, 30, 30, 30};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(restart_backoff(i).count(), want[i]) << i;
}

TEST(SuperviseTest, EveryWorkerIsGoneOnlyWhenAllWereGivenUp) {
  using W = WorkerState;
  struct Case {
    std::vector<W> workers;
    bool gone;
  };
  const Case cases[] = {
      {{}, false},
      {{W::kGivenUp}, true},
      {{W::kGivenUp, W::kGivenUp}, true},
      {{W::kGivenUp, W::kRunning}, false},
      {{W::kGivenUp, W::kRestarting}, false},  // one still comes back
      // The run finished (the trainer told them): it ends by itself.
      {{W::kGivenUp, W::kFinished}, false},
      {{W::kFinished, W::kFinished}, false},
      {{W::kRunning}, false},
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    EXPECT_EQ(every_worker_gone(cases[i].workers), cases[i].gone) << "case " << i;
  }
}

}  // namespace
}  // namespace relay::cli
