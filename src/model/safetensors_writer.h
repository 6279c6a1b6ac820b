// Writing safetensors files, streaming: tensors are declared with a fill function and produced one at a
// time while the file is written, so a checkpoint larger than memory can be synthesized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/tensor.h"

namespace tern::model {

class SafetensorsWriter {
 public:
  // Writes exactly dtype_bytes(dtype, shape.numel()) bytes to dst (which is zeroed).
  using Fill = std::function<void(std::byte* dst)>;

  void add(std::string name, DType dtype, Shape shape, Fill fill);
  void add_bytes(std::string name, DType dtype, Shape shape, std::vector<std::byte> bytes);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

  size_t size() const { return tensors_.size(); }
  uint64_t data_bytes() const;
  std::vector<std::string> names() const;

  // Writes `path` (through path + ".tmp", renamed when complete). Tensors are laid out contiguously
  // (no holes, as the safetensors format requires), widest element type first and then by name, after a
  // header padded with spaces to a multiple of 8 bytes: every tensor is aligned for its dtype.
  void write(const std::string& path) const;

 private:
  struct Pending {
    std::string name;
    DType dtype;
    Shape shape;
    Fill fill;
  };
  std::vector<Pending> tensors_;
  std::unordered_set<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace tern::model
