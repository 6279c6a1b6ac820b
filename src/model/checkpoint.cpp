#include "model/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace tern::model {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TERN_CHECK(in, path, ": cannot open");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A shard name from the index must be a plain file name inside the checkpoint directory.
bool plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos && s.find('\\') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  TERN_CHECK(fs::is_directory(dir), dir, ": not a directory (expected a checkpoint directory with config.json and ",
             "model.safetensors or model.safetensors.index.json)");
  auto st = std::make_shared<State>();
  st->dir = dir;
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  const std::string single_path = (fs::path(dir) / "model.safetensors").string();

  auto add_file = [&](const std::string& path) -> SafetensorsFile& {
    st->files.push_back(SafetensorsFile::open(path));
    return *st->files.back();
  };

  if (fs::exists(index_path)) {
    st->source = index_path;
    json idx;
    try {
      idx = json::parse(read_text(index_path));
    } catch (const json::exception& e) {
      fail(index_path, ": not valid JSON (", e.what(), ")");
    }
    TERN_CHECK(idx.is_object() && idx.contains("weight_map") && idx["weight_map"].is_object(), index_path,
               ": expected a JSON object with a \"weight_map\" object");
    // Shards in sorted order, each opened once.
    std::map<std::string, std::vector<std::string>> by_shard;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      TERN_CHECK(it.value().is_string(), index_path, ": tensor \"", it.key(), "\": expected a shard file name, found ",
                 it.value().dump());
      const std::string shard = it.value().get<std::string>();
      TERN_CHECK(plain_file_name(shard), index_path, ": tensor \"", it.key(), "\": shard \"", shard,
                 "\" must be a file name in the checkpoint directory");
      by_shard[shard].push_back(it.key());
    }
    for (const auto& [shard, names] : by_shard) {
      const std::string path = (fs::path(dir) / shard).string();
      TERN_CHECK(fs::exists(path), index_path, ": shard \"", shard, "\" (holding tensor \"", names.front(), "\" and ",
                 names.size() - 1, " more) does not exist in ", dir);
      const SafetensorsFile& f = add_file(path);
      for (const std::string& name : names) {
        const SafetensorsEntry* e = f.find(name);
        TERN_CHECK(e, index_path, ": tensor \"", name, "\" is mapped to ", path, ", which does not contain it");
        st->tensors.emplace(name, Ref{&f, e});
      }
    }
  } else {
    std::vector<std::string> paths;
    if (fs::exists(single_path)) {
      paths.push_back(single_path);
      st->source = single_path;
    } else {
      for (const auto& de : fs::directory_iterator(dir))
        if (de.path().extension() == ".safetensors") paths.push_back(de.path().string());
      std::sort(paths.begin(), paths.end());
      TERN_CHECK(!paths.empty(), dir, ": no model.safetensors, model.safetensors.index.json or *.safetensors file");
      st->source = dir;
    }
    for (const std::string& path : paths) {
      const SafetensorsFile& f = add_file(path);
      for (const SafetensorsEntry& e : f.entries()) {
        const auto [it, fresh] = st->tensors.emplace(e.name, Ref{&f, &e});
        TERN_CHECK(fresh, path, ": tensor \"", e.name, "\" is also in ", it->second.file->path(),
                   " (without an index, each tensor must be in exactly one file)");
      }
    }
  }
  Checkpoint c;
  c.state_ = std::move(st);
  return c;
}

bool Checkpoint::has(const std::string& name) const { return state_ && state_->tensors.count(name) != 0; }

const Checkpoint::Ref& Checkpoint::ref(const std::string& name) const {
  TERN_CHECK(state_, "checkpoint not opened");
  const auto it = state_->tensors.find(name);
  TERN_CHECK(it != state_->tensors.end(), state_->source, ": tensor \"", name, "\" is missing");
  return it->second;
}

TensorView Checkpoint::get(const std::string& name) const {
  const Ref& r = ref(name);
  return r.file->view(*r.entry);
}

const SafetensorsEntry& Checkpoint::entry(const std::string& name) const { return *ref(name).entry; }

const std::string& Checkpoint::file_of(const std::string& name) const { return ref(name).file->path(); }

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  if (!state_) return out;
  out.reserve(state_->tensors.size());
  for (const auto& [name, r] : state_->tensors) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  if (!state_) return n;
  for (const auto& [name, r] : state_->tensors) n += r.entry->end - r.entry->begin;
  return n;
}

}  // namespace tern::model
