#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tern::model {

using json = nlohmann::json;

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TERN_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path, ": cannot stat: ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, ": not a regular file");
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail(path, ": cannot map ", f->size_, " bytes: ", std::strerror(err));
    }
    f->data_ = static_cast<std::byte*>(p);
  }
  ::close(fd);  // the mapping keeps the file referenced
  return f;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

namespace {

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// numel * bits / 8 for a shape, or false on overflow / a sub-byte total that is not whole bytes.
bool exact_nbytes(const std::vector<int64_t>& dims, int bits, uint64_t* out) {
  unsigned __int128 n = 1;
  for (int64_t d : dims) {
    n *= static_cast<uint64_t>(d);
    if (n > (static_cast<unsigned __int128>(1) << 62)) return false;
  }
  const unsigned __int128 total_bits = n * static_cast<unsigned>(bits);
  if (total_bits % 8 != 0) return false;
  *out = static_cast<uint64_t>(total_bits / 8);
  return true;
}

}  // namespace

std::vector<SafetensorsEntry> parse_safetensors_header(const std::string& header_json, uint64_t data_bytes,
                                                       const std::string& source,
                                                       std::map<std::string, std::string>* metadata) {
  json h;
  try {
    h = json::parse(header_json);
  } catch (const json::exception& e) {
    fail(source, ": the safetensors header is not valid JSON (", e.what(), ")");
  }
  TERN_CHECK(h.is_object(), source, ": the safetensors header must be a JSON object, found ", h.type_name());
  std::vector<SafetensorsEntry> entries;
  entries.reserve(h.size());
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      TERN_CHECK(v.is_object(), source, ": \"__metadata__\" must be a JSON object, found ", v.type_name());
      for (auto m = v.begin(); m != v.end(); ++m)
        if (metadata && m.value().is_string()) (*metadata)[m.key()] = m.value().get<std::string>();
      continue;
    }
    const std::string where = cat(source, ": tensor \"", name, "\": ");
    TERN_CHECK(v.is_object(), where, "expected a JSON object with dtype, shape and data_offsets, found ", v.dump());
    TERN_CHECK(v.contains("dtype") && v["dtype"].is_string(), where, "expected a string \"dtype\"");
    SafetensorsEntry e;
    e.name = name;
    const std::string dtype = v["dtype"].get<std::string>();
    TERN_CHECK(dtype_from_safetensors(dtype, &e.dtype), where, "unknown dtype \"", dtype,
               "\" (tern reads F32, F16, BF16, F8_E4M3, F8_E8M0, F4, I8, U8, I32, I64)");
    TERN_CHECK(v.contains("shape") && v["shape"].is_array(), where, "expected a list \"shape\"");
    std::vector<int64_t> dims;
    for (const json& d : v["shape"]) {
      TERN_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0 && d.get<int64_t>() <= (int64_t{1} << 48), where,
                 "shape entries must be non-negative integers, found ", v["shape"].dump());
      dims.push_back(d.get<int64_t>());
    }
    TERN_CHECK(dims.size() <= static_cast<size_t>(kMaxDims), where, "rank ", dims.size(), " exceeds tern's maximum of ",
               kMaxDims);
    e.shape = Shape(dims);
    const json& off = v.contains("data_offsets") ? v["data_offsets"] : json();
    TERN_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(), where,
               "expected \"data_offsets\": [begin, end] with non-negative integers, found ", off.dump());
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    TERN_CHECK(e.begin <= e.end, where, "data_offsets [", e.begin, ", ", e.end, "] end before they begin");
    TERN_CHECK(e.end <= data_bytes, where, "data_offsets [", e.begin, ", ", e.end,
               "] reach past the end of the data section (", data_bytes,
               " bytes): the file is truncated or the header is corrupt");
    uint64_t nbytes = 0;
    TERN_CHECK(exact_nbytes(dims, dtype_bits(e.dtype), &nbytes), where, "shape ", e.shape.str(), " of ", dtype,
               " is not a whole number of bytes (or is too large)");
    TERN_CHECK(e.end - e.begin == nbytes, where, "data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin,
               " bytes, but ", dtype, " ", e.shape.str(), " needs ", nbytes);
    entries.push_back(std::move(e));
  }
  // No two tensors may share bytes.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : entries)
    if (e.end > e.begin) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const SafetensorsEntry& a = *by_offset[i - 1];
    const SafetensorsEntry& b = *by_offset[i];
    TERN_CHECK(b.begin >= a.end, source, ": tensor \"", b.name, "\" (bytes ", b.begin, "..", b.end,
               ") overlaps tensor \"", a.name, "\" (bytes ", a.begin, "..", a.end, ")");
  }
  return entries;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto f = std::make_shared<SafetensorsFile>();
  f->file_ = MappedFile::open(path);
  const uint64_t size = f->file_->size();
  TERN_CHECK(size >= 8, path, ": not a safetensors file: ", size,
             " bytes, but the 8-byte header length alone needs 8 (empty or truncated file)");
  const uint64_t n = read_le64(f->file_->data());
  TERN_CHECK(n <= size - 8, path, ": header length ", n, " exceeds the file size (", size,
             " bytes): not a safetensors file, or truncated");
  TERN_CHECK(n <= kMaxSafetensorsHeaderBytes, path, ": header length ", n, " exceeds the limit of ",
             kMaxSafetensorsHeaderBytes, " bytes");
  f->data_offset_ = 8 + n;
  const std::string header(reinterpret_cast<const char*>(f->file_->data() + 8), n);
  f->entries_ = parse_safetensors_header(header, size - f->data_offset_, path, &f->metadata_);
  f->index_.reserve(f->entries_.size());
  for (size_t i = 0; i < f->entries_.size(); ++i) f->index_.emplace(f->entries_[i].name, i);
  return f;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

TensorView SafetensorsFile::view(const SafetensorsEntry& e) const {
  // const_cast: TensorView has no const flavour; the mapping is PROT_READ, so a write would fault.
  auto* p = const_cast<std::byte*>(file_->data() + data_offset_ + e.begin);
  return TensorView(p, e.dtype, e.shape);
}

}  // namespace tern::model
