#pragma once

// Trajectory groups between their C++ form (relay/rollout/trajectory.h) and
// the wire/store form (proto/relay/v1/trajectory.proto). Every field crosses;
// NaN log-probs and rewards stay NaN.

#include "relay/common/status.h"
#include "relay/rollout/trajectory.h"

namespace relay::v1 {
class Trajectory;
class TrajectoryGroup;
}  // namespace relay::v1

namespace relay::store {

void to_proto(const rollout::Trajectory& in, v1::Trajectory* out);
void to_proto(const rollout::TrajectoryGroup& in, v1::TrajectoryGroup* out);

// Token ids are int32 on the wire (vocabularies are far below 2^31).
// from_proto: InvalidArgument, naming the trajectory and field, for an
// unknown enum value or per-token fields that fail rollout::check_trajectory().
// `check` = false skips check_trajectory (enums are still checked): for
// input that comm::validate_submission() checks next, with its tolerance for
// log-prob rounding.
StatusOr<rollout::Trajectory> from_proto(const v1::Trajectory& in, bool check = true);
StatusOr<rollout::TrajectoryGroup> from_proto(const v1::TrajectoryGroup& in, bool check = true);

}  // namespace relay::store
