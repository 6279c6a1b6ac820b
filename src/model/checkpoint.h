// A checkpoint directory's tensors by name: one model.safetensors, or shards listed by
// model.safetensors.index.json ({"weight_map": {"<tensor>": "<shard file>"}}). Every file is mapped
// and its header checked at open; every tensor of the index must be in the shard it is mapped to.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "model/safetensors.h"

namespace tern::model {

class Checkpoint {
 public:
  Checkpoint() = default;
  // Opens `dir` (see above); with neither model.safetensors nor the index, every *.safetensors file
  // in the directory (a tensor name found twice is an error).
  static Checkpoint open(const std::string& dir);

  bool has(const std::string& name) const;
  // The tensor's view (read-only mapped memory); throws naming the checkpoint if it is missing.
  TensorView get(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const;
  // The file that holds `name` (full path).
  const std::string& file_of(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  size_t size() const { return state_ ? state_->tensors.size() : 0; }

  const std::string& dir() const { return state_->dir; }
  // What error messages name for a missing tensor: the index file, or the single file.
  const std::string& source() const { return state_->source; }
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return state_->files; }
  uint64_t total_bytes() const;  // sum of the tensors' bytes

 private:
  struct Ref {
    const SafetensorsFile* file;
    const SafetensorsEntry* entry;
  };
  struct State {
    std::string dir, source;
    std::vector<std::shared_ptr<SafetensorsFile>> files;
    std::unordered_map<std::string, Ref> tensors;
  };
  const Ref& ref(const std::string& name) const;

  std::shared_ptr<State> state_;

 public:
  // Keeps the mappings alive (for ModelWeights::storage).
  std::shared_ptr<const void> keep_alive() const { return state_; }
};

}  // namespace tern::model
