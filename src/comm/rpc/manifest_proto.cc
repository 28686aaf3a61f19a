#include "relay/comm/rpc/manifest_proto.h"

#include "relay/v1/weights.pb.h"

namespace relay::comm {

void to_proto(const model::WeightManifest& in, v1::WeightManifest* out) {
  out->Clear();
  out->set_version(in.version);
  out->set_digest(in.digest);
  for (const model::TensorSpec& spec : in.tensors) {
    v1::TensorSpec* t = out->add_tensors();
    t->set_name(spec.name);
    t->mutable_shape()->Add(spec.shape.begin(), spec.shape.end());
    t->set_dtype(spec.dtype);
    t->set_num_bytes(spec.num_bytes);
  }
}

model::WeightManifest from_proto(const v1::WeightManifest& in) {
  model::WeightManifest m;
  m.version = in.version();
  m.digest = in.digest();
  for (const v1::TensorSpec& t : in.tensors()) {
    model::TensorSpec spec;
    spec.name = t.name();
    spec.shape.assign(t.shape().begin(), t.shape().end());
    spec.dtype = t.dtype();
    spec.num_bytes = t.num_bytes();
    m.tensors.push_back(std::move(spec));
  }
  return m;
}

}  // namespace relay::comm
