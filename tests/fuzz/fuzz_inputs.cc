// relay_fuzz_inputs: a bounded mutation fuzzer for the parsers of files relay
// does not write (fuzz_targets.h). Each target's seeds come from
// <corpus>/<target>/; batches of mutated inputs run in a forked child, so a
// crash (any signal), an uncaught exception (SIGABRT), an allocation past
// the memory limit or a hang (SIGALRM) ends only that child: the parent
// reports it with the target and the signal, saves the input under
// --crash-dir, and goes on with the next batch. Exit status 1 when anything
// crashed. docs/fuzzing.md has the commands.
//
//   relay_fuzz_inputs [--target NAME|all] [--seconds N] [--runs N] [--seed N]
//                     [--corpus DIR] [--crash-dir DIR] [--batch N]
//                     [--timeout S] [--memory-mb N]
//   relay_fuzz_inputs --target NAME --replay FILE...   (in this process)

#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_targets.h"
#include "fuzz/mutator.h"
#include "relay/common/file_io.h"

namespace relay::fuzz {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string target = "all";
  double seconds = 60;  // for all targets together
  uint64_t runs = 0;    // per target; 0 = until --seconds
  uint64_t seed = 1;    // the same seed gives the same inputs
  std::string corpus = RELAY_SOURCE_DIR "/tests/fuzz/corpus";
  std::string crash_dir = "fuzz-crashes";
  uint64_t batch = 500;             // inputs per forked child
  unsigned timeout = 10;            // seconds one input may take
  uint64_t memory_mb = 2048;        // address space a child may add
  std::vector<std::string> replay;  // files to run in-process instead
};

// What a child leaves for the parent: how far it got, and the input it is
// running, which is the crashing one when it dies.
struct Shared {
  uint64_t executions;  // finished inputs
  uint64_t accepted;    // of which the parser returned OK
  uint64_t length;
  char input[kMaxInputBytes];
};

struct Tally {
  uint64_t executions = 0, accepted = 0, crashes = 0;
  double seconds = 0;
};

void usage() {
  std::fprintf(stderr,
               "usage: relay_fuzz_inputs [--target NAME|all] [--seconds N] [--runs N] [--seed N]\n"
               "                         [--corpus DIR] [--crash-dir DIR] [--batch N]\n"
               "                         [--timeout S] [--memory-mb N]\n"
               "       relay_fuzz_inputs --target NAME --replay FILE...\n"
               "targets:");
  for (const FuzzTarget& t : fuzz_targets()) std::fprintf(stderr, " %s", t.name);
  std::fprintf(stderr, "\n");
}

bool parse_args(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&](const char* flag) -> const char* {
      if (arg != flag || i + 1 >= argc) return nullptr;
      return argv[++i];
    };
    const char* v = nullptr;
    if ((v = value("--target"))) {
      o->target = v;
    } else if ((v = value("--seconds"))) {
      if (!absl::SimpleAtod(v, &o->seconds) || o->seconds <= 0) return false;
    } else if ((v = value("--runs"))) {
      if (!absl::SimpleAtoi(v, &o->runs)) return false;
    } else if ((v = value("--seed"))) {
      if (!absl::SimpleAtoi(v, &o->seed)) return false;
    } else if ((v = value("--corpus"))) {
      o->corpus = v;
    } else if ((v = value("--crash-dir"))) {
      o->crash_dir = v;
    } else if ((v = value("--batch"))) {
      if (!absl::SimpleAtoi(v, &o->batch) || o->batch == 0) return false;
    } else if ((v = value("--timeout"))) {
      if (!absl::SimpleAtoi(v, &o->timeout) || o->timeout == 0) return false;
    } else if ((v = value("--memory-mb"))) {
      if (!absl::SimpleAtoi(v, &o->memory_mb)) return false;
    } else if (arg == "--replay") {
      for (++i; i < argc; ++i) o->replay.push_back(argv[i]);
      if (o->replay.empty()) return false;
    } else {
      std::fprintf(stderr, "relay_fuzz_inputs: unknown argument '%s'\n", arg.c_str());
      return false;
    }
  }
  return true;
}

// The seeds of one target: every file under <corpus>/<target>/, in name
// order so that a seed gives the same run everywhere.
StatusOr<std::vector<std::string>> read_corpus(const std::string& dir) {
  std::error_code ec;
  std::set<std::string> paths;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_regular_file()) paths.insert(entry.path().string());
  }
  if (ec) return NotFoundError(absl::StrCat(dir, ": cannot list the seeds: ", ec.message()));
  std::vector<std::string> seeds;
  for (const std::string& path : paths) {
    RELAY_ASSIGN_OR_RETURN(std::string text, read_file(path));
    seeds.push_back(std::move(text));
  }
  if (seeds.empty()) return NotFoundError(dir + ": no seed files");
  return seeds;
}

// Address space the process has mapped now (LibTorch maps a lot), so the
// child's limit is a margin over it rather than an absolute size.
uint64_t mapped_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t pages = 0;
  statm >> pages;
  return pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// FNV-1a, to name saved inputs by their contents.
uint64_t fingerprint(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

std::string describe_end(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return absl::StrCat("signal ", sig, " (", sig == SIGALRM ? "timeout" : strsignal(sig), ")");
  }
  return absl::StrCat("exit status ", WEXITSTATUS(status));
}

// Runs the child side of one batch; never returns.
[[noreturn]] void run_batch(const FuzzTarget& target, Mutator* mutator, Shared* shared,
                            uint64_t count, Clock::time_point deadline, const Options& o,
                            const std::string& scratch, uint64_t memory_limit) {
  rlimit limit{memory_limit, memory_limit};
  setrlimit(RLIMIT_AS, &limit);
  signal(SIGALRM, SIG_DFL);
  for (uint64_t i = 0; i < count && Clock::now() < deadline; ++i) {
    const std::string input = mutator->next();
    std::memcpy(shared->input, input.data(), input.size());
    shared->length = input.size();
    alarm(o.timeout);
    const bool ok = target.run(input, scratch).ok();
    alarm(0);
    shared->accepted += ok;
    ++shared->executions;
  }
  std::fflush(nullptr);
  _exit(0);
}

Tally fuzz_target(const FuzzTarget& target, const Options& o, double seconds, Shared* shared,
                  const std::string& scratch) {
  Tally tally;
  StatusOr<std::vector<std::string>> seeds = read_corpus(o.corpus + "/" + target.name);
  if (!seeds.ok()) {
    std::fprintf(stderr, "fuzz: %s\n", std::string(seeds.status().message()).c_str());
    tally.crashes = 1;  // a run that fuzzed nothing must not pass
    return tally;
  }
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  const uint64_t memory_limit = mapped_bytes() + (o.memory_mb << 20);
  std::set<uint64_t> saved;
  for (uint64_t batch = 0; Clock::now() < deadline && (o.runs == 0 || tally.executions < o.runs);
       ++batch) {
    // Each batch has its own generator, seeded from --seed, the target and
    // the batch number: a run is repeatable, and a crash does not shift the
    // inputs of the batches after it.
    Mutator mutator(target.kind, *seeds,
                    o.seed * 1000003 + fingerprint(target.name) + batch * 7919);
    const uint64_t count = o.runs == 0 ? o.batch : std::min(o.batch, o.runs - tally.executions);
    shared->executions = shared->accepted = shared->length = 0;
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fuzz: fork");
      tally.crashes++;
      break;
    }
    if (pid == 0) run_batch(target, &mutator, shared, count, deadline, o, scratch, memory_limit);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    tally.executions += shared->executions;
    tally.accepted += shared->accepted;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    // The child died on the input in shared->input.
    tally.executions++;
    tally.crashes++;
    const std::string_view input(shared->input, shared->length);
    const uint64_t id = fingerprint(input);
    if (!saved.insert(id).second) continue;
    std::error_code ec;
    fs::create_directories(o.crash_dir, ec);
    char name[64];
    std::snprintf(name, sizeof(name), "%s-%016llx%s", target.name,
                  static_cast<unsigned long long>(id), target.extension);
    const std::string path = (fs::path(o.crash_dir) / name).string();
    std::ofstream(path, std::ios::binary).write(input.data(), input.size());
    std::fprintf(stderr,
                 "fuzz: CRASH target=%s %s on a %zu-byte input, saved as %s\n"
                 "      replay: relay_fuzz_inputs --target %s --replay %s\n",
                 target.name, describe_end(status).c_str(), input.size(), path.c_str(), target.name,
                 path.c_str());
  }
  tally.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return tally;
}

int replay(const FuzzTarget& target, const Options& o, const std::string& scratch) {
  // The same memory limit as a fuzzing child: an input that allocates
  // without end fails with std::bad_alloc rather than taking the machine.
  const uint64_t memory_limit = mapped_bytes() + (o.memory_mb << 20);
  rlimit limit{memory_limit, memory_limit};
  setrlimit(RLIMIT_AS, &limit);
  for (const std::string& path : o.replay) {
    StatusOr<std::string> input = read_file(path);
    if (!input.ok()) {
      std::fprintf(stderr, "%s\n", std::string(input.status().message()).c_str());
      return 2;
    }
    const Status s = target.run(*input, scratch);
    std::printf("%s: %s\n", path.c_str(), s.ok() ? "OK" : std::string(s.message()).c_str());
  }
  return 0;
}

int fuzz_main(int argc, char** argv) {
  Options o;
  if (!parse_args(argc, argv, &o)) {
    usage();
    return 2;
  }
  std::vector<const FuzzTarget*> targets;
  if (o.target == "all") {
    for (const FuzzTarget& t : fuzz_targets()) targets.push_back(&t);
  } else if (const FuzzTarget* t = find_fuzz_target(o.target)) {
    targets.push_back(t);
  } else {
    std::fprintf(stderr, "relay_fuzz_inputs: unknown target '%s'\n", o.target.c_str());
    usage();
    return 2;
  }
  char scratch_template[] = "/tmp/relay-fuzz-XXXXXX";
  if (mkdtemp(scratch_template) == nullptr) {
    std::perror("fuzz: mkdtemp");
    return 2;
  }
  const std::string scratch = scratch_template;
  int rc = 0;
  if (!o.replay.empty()) {
    if (targets.size() != 1) {
      std::fprintf(stderr, "relay_fuzz_inputs: --replay needs one --target\n");
      rc = 2;
    } else {
      rc = replay(*targets[0], o, scratch);
    }
  } else {
    void* map =
        mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) {
      std::perror("fuzz: mmap");
      return 2;
    }
    auto* shared = static_cast<Shared*>(map);
    Tally total;
    for (const FuzzTarget* t : targets) {
      const Tally tally = fuzz_target(*t, o, o.seconds / targets.size(), shared, scratch);
      std::printf("fuzz: %-16s %8llu executions (%llu accepted) in %5.1f s, %llu crashes\n",
                  t->name, static_cast<unsigned long long>(tally.executions),
                  static_cast<unsigned long long>(tally.accepted), tally.seconds,
                  static_cast<unsigned long long>(tally.crashes));
      std::fflush(stdout);
      total.executions += tally.executions;
      total.crashes += tally.crashes;
    }
    std::printf("fuzz: total %llu executions, %llu crashes (seed %llu)\n",
                static_cast<unsigned long long>(total.executions),
                static_cast<unsigned long long>(total.crashes),
                static_cast<unsigned long long>(o.seed));
    munmap(map, sizeof(Shared));
    rc = total.crashes == 0 ? 0 : 1;
  }
  std::error_code ec;
  fs::remove_all(scratch, ec);
  return rc;
}

}  // namespace
}  // namespace relay::fuzz

int main(int argc, char** argv) { return relay::fuzz::fuzz_main(argc, argv); }
