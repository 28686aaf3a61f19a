#pragma once

// What the writers of model directories share (private to src/model): the
// staging directory, the extra files, keeping the files already there, and
// the rename that makes a checkpoint appear whole or not at all.

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

#include "relay/common/status.h"
#include "relay/model/checkpoint.h"

namespace relay::model {

// Runs `write` on a fresh staging directory beside `dir` (config.json and
// the weights go there), adds options.extra_files, keeps the other files of
// an existing `dir` (a tokenizer) and renames the staging directory into
// place. AlreadyExists when `dir` exists and options.overwrite is false; on
// any error the staging directory is removed and `dir` is as it was.
Status save_model_directory(const std::string& dir, const SaveOptions& options,
                            const std::function<Status(const std::string& staging)>& write);

class CheckpointTensors;

// Every parameter of `model` by name, detached, on the CPU, contiguous and
// in `dtype` (Undefined = each in its own): what a writer hands to
// write_checkpoint_tensors. `saved` gets the dtype written (options.dtype,
// or the parameters' own), for config.json's torch_dtype.
std::vector<std::pair<std::string, at::Tensor>> tensors_for_save(torch::nn::Module& model,
                                                                 c10::ScalarType dtype,
                                                                 c10::ScalarType* saved);

// Fills every parameter of `model` from `tensors` by name, but those `keep`
// says to leave as they are. A missing tensor, another shape than the
// parameter's (the one config.json implies), or a tensor of the directory
// that filled nothing and is not `ignorable` is InvalidArgument naming `dir`
// and the tensor; `what` names the model in the last ("the llama
// architecture"). REQUIRES: gradients off (NoGradGuard).
Status fill_parameters(torch::nn::Module& model, const CheckpointTensors& tensors,
                       const std::string& dir, const std::string& what,
                       const std::function<bool(const std::string&)>& keep,
                       const std::function<bool(const std::string&)>& ignorable);

}  // namespace relay::model
