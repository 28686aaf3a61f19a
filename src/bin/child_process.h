#pragma once

// Child processes for `relay run`: starting one with extra environment,
// looking whether it ended (with its peak memory), stopping it politely and
// then not. POSIX only; the decisions about them are in bin/supervise.h.

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "bin/supervise.h"
#include "relay/common/status.h"

namespace relay::cli {

// Starts `args` (args[0] a path) with this process's environment plus `env`
// ("NAME=value", replacing a variable of the same name).
StatusOr<pid_t> spawn(const std::vector<std::string>& args,
                      const std::vector<std::string>& env = {});

// How the child ended, once it has; nullopt while it runs.
std::optional<ChildExit> poll_exit(pid_t pid);

// SIGTERM, then SIGKILL after `grace`; how it ended.
ChildExit stop_child(pid_t pid, std::chrono::milliseconds grace);

// A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick).
StatusOr<int> free_loopback_port();

// The directory this executable lives in: relay-trainer and relay-rollout
// are installed (and built) next to it.
std::string own_dir();

}  // namespace relay::cli
