// Child processes for `relay run` (bin/child_process.h).

#include "bin/child_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace relay::cli {

std::string own_dir() {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

StatusOr<pid_t> spawn(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view var(*e);
    const bool replaced = std::any_of(env.begin(), env.end(), [&](const std::string& x) {
      const size_t eq = x.find('=');
      return var.substr(0, eq + 1) == std::string_view(x).substr(0, eq + 1);
    });
    if (!replaced) envp.push_back(*e);
  }
  for (const std::string& x : env) envp.push_back(const_cast<char*>(x.c_str()));
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data());
  if (rc != 0) {
    return InternalError(absl::StrCat("cannot start ", args[0], ": ", std::strerror(rc)));
  }
  return pid;
}

// Reaped with wait4() rather than waitpid() for its rusage: the peak RSS
// says whether a SIGKILL was probably the out-of-memory killer.
std::optional<ChildExit> poll_exit(pid_t pid) {
  int status = 0;
  rusage usage{};
  if (::wait4(pid, &status, WNOHANG, &usage) != pid) return std::nullopt;
  return child_exit(status, usage.ru_maxrss);
}

ChildExit stop_child(pid_t pid, std::chrono::milliseconds grace) {
  if (std::optional<ChildExit> e = poll_exit(pid)) return *e;
  ::kill(pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::optional<ChildExit> e = poll_exit(pid)) return *e;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  rusage usage{};
  ::wait4(pid, &status, 0, &usage);
  ChildExit e = child_exit(status, usage.ru_maxrss);
  e.killed_by_supervisor = e.signaled && e.code == SIGKILL;
  return e;
}

StatusOr<int> free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return InternalError(absl::StrCat("cannot pick a loopback port: ", std::strerror(err)));
  return static_cast<int>(ntohs(addr.sin_port));
}

}  // namespace relay::cli
