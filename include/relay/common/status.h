#pragma once

// Errors are values. relay uses absl::Status / absl::StatusOr, whose codes are
// gRPC's canonical codes, so an RPC handler converts one to grpc::Status with a
// static_cast of the code and nothing is lost.
//
// Return a Status from anything that does I/O, parses input, or crosses a
// module or process boundary. Messages name the thing that is wrong:
//   "configs/grpo.yaml: rollout.n: must be >= 1, got 0".

#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace relay {

using Status = absl::Status;
template <typename T>
using StatusOr = absl::StatusOr<T>;

using absl::AlreadyExistsError;
using absl::CancelledError;
using absl::DataLossError;
using absl::DeadlineExceededError;
using absl::FailedPreconditionError;
using absl::InternalError;
using absl::InvalidArgumentError;
using absl::NotFoundError;
using absl::OkStatus;
using absl::OutOfRangeError;
using absl::UnavailableError;
using absl::UnimplementedError;

namespace internal {
[[noreturn]] void check_failed(const char* file, int line, const char* expr, const char* msg);
}  // namespace internal

}  // namespace relay

#define RELAY_STATUS_CONCAT_INNER_(a, b) a##b
#define RELAY_STATUS_CONCAT_(a, b) RELAY_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define RELAY_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::relay::Status relay_status_ = (expr);        \
    if (!relay_status_.ok()) return relay_status_; \
  } while (0)

// `lhs` = value of `rexpr` (a StatusOr<T>), or returns its error.
#define RELAY_ASSIGN_OR_RETURN(lhs, rexpr) \
  RELAY_ASSIGN_OR_RETURN_IMPL_(RELAY_STATUS_CONCAT_(relay_statusor_, __LINE__), lhs, rexpr)
#define RELAY_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                 \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

// A broken invariant is a bug: log and abort. Not for validating input.
#define RELAY_CHECK(cond, msg)                                                      \
  do {                                                                              \
    if (!(cond)) ::relay::internal::check_failed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
