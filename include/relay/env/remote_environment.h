#pragma once

// An environment served by another process (task.environment: remote), over
// the environment protocol of proto/relay/v1/environment.proto: Describe once
// per worker, then Reset / Step / Close per episode, each call under a
// deadline. The server may be written in any language
// (examples/environments/ has a Python one).
//
// Failures of the server are the episode's, not the worker's: a call that
// fails (the process crashed, refused, or answered past the deadline) is an
// error status naming the address, the call and gRPC's code, which the
// episode driver records as the episode's env_error. Close is sent without
// waiting for its answer when an episode's environment is destroyed.
// No LibTorch, and no gRPC types in this header.

#include <chrono>
#include <memory>
#include <string>

#include "relay/common/status.h"
#include "relay/env/environment.h"

namespace relay::env {

struct RemoteEnvironmentOptions {
  std::string address;  // host:port of the environment server
  // Deadline of each call (Describe, Reset, Step); past it the call fails
  // with DEADLINE_EXCEEDED and the episode ends as env_error.
  std::chrono::milliseconds deadline{60000};
  // Describe's deadline when the factory is made, which includes connecting:
  // a server that is not up fails the worker's start here, naming the address.
  std::chrono::milliseconds connect_timeout{10000};
};

// Connects to the server at options.address and asks for its tool schemas.
// Unavailable (naming the address) when it does not answer within
// connect_timeout; InvalidArgument for an empty address or a tool schema that
// is not a JSON object. The factory is shared by the worker's threads; each
// make() is a new episode with an id of its own.
StatusOr<std::shared_ptr<const EnvironmentFactory>> connect_remote_environment(
    const RemoteEnvironmentOptions& options);

}  // namespace relay::env
