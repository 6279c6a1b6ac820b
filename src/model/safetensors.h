// Reading safetensors files through a read-only memory map: nothing is copied, tensors are views
// into the mapping. The header is checked before any view is handed out, so that a corrupt or
// truncated file is an error at open (naming the file and tensor), never a crash on access.
//
// Format: 8-byte little-endian header length N, N bytes of JSON header, then the data section.
// Header: {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
//          "__metadata__": {"<key>": "<value>"}} with offsets relative to the data section.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"

namespace tern::model {

// A whole file mapped read-only (PROT_READ, MAP_PRIVATE). Views into it must not be written.
class MappedFile {
 public:
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets relative to the data section
};

// Limits that a header is checked against.
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

class SafetensorsFile {
 public:
  // Maps and validates `path`. Throws tern::Error naming the file (and tensor) when the file is not
  // a well-formed safetensors file: see docs/checkpoints.md for every check.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  uint64_t file_size() const { return file_->size(); }
  uint64_t data_offset() const { return data_offset_; }  // 8 + header length
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in header order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const;
  // A view of the entry's bytes in the mapping (read-only memory).
  TensorView view(const SafetensorsEntry& e) const;

 private:
  std::shared_ptr<MappedFile> file_;
  uint64_t data_offset_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Parses and checks a header against a data section of `data_bytes` bytes. Exposed for tests and the
// writer; `source` names the file in messages.
std::vector<SafetensorsEntry> parse_safetensors_header(const std::string& header_json, uint64_t data_bytes,
                                                       const std::string& source,
                                                       std::map<std::string, std::string>* metadata);

}  // namespace tern::model
