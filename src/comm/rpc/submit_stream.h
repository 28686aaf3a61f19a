#pragma once

// How a SubmitGroups stream carries several groups in flight, shared by the
// trainer's handler (comm/service/trainer_service.cc) and relay's client
// (comm/rpc/grpc_trainer_client.cc).
//
// A client that sends a group before it has read the acks of those before
// it says so in the call's metadata (kSubmitAheadMetadata, value "1"), and
// keeps at most kSubmitWindow groups unacknowledged. The trainer then reads
// up to kSubmitWindow groups ahead of their acks, on a second thread, so
// that the stream's groups share one store write (store/dispenser.h, group
// commit); each ack still goes out once its group is durable, in order. A
// call without the key is answered one group at a time, as every client
// that waits for each ack expects (and without the second thread, which a
// stream of one group would pay for and not use).

#include <cstddef>

namespace relay::comm {

inline constexpr char kSubmitAheadMetadata[] = "relay-submit-ahead";
inline constexpr size_t kSubmitWindow = 16;

}  // namespace relay::comm
