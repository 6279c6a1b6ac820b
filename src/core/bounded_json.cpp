#include "core/bounded_json.h"

#include <vector>

namespace tern {

namespace {

// Builds the document from nlohmann's SAX events, as its own DOM parser does, and checks every limit
// before the value it concerns is stored.
template <class Json>
class BoundedBuilder {
 public:
  using string_t = typename Json::string_t;

  explicit BoundedBuilder(const JsonLimits& limits) : limits_(limits) {}

  bool null() { return put(Json(nullptr)); }
  bool boolean(bool v) { return put(Json(v)); }
  bool number_integer(typename Json::number_integer_t v) { return put(Json(v)); }
  bool number_unsigned(typename Json::number_unsigned_t v) { return put(Json(v)); }
  bool number_float(typename Json::number_float_t v, const string_t&) { return put(Json(v)); }
  bool string(string_t& v) {
    if (v.size() > limits_.max_string_bytes) over(cat("is a string longer than ", limits_.max_string_bytes, " bytes"));
    return put(Json(std::move(v)));
  }
  bool binary(typename Json::binary_t&) { return false; }  // not in JSON text
  bool start_object(std::size_t) { return open(Json::object()); }
  bool key(string_t& k) {
    if (k.size() > limits_.max_string_bytes) over(cat("holds a key longer than ", limits_.max_string_bytes, " bytes"), false);
    Level& l = levels_.back();
    if (++l.count > limits_.max_object_members)
      over(cat("holds more than ", limits_.max_object_members, " members"), false);
    l.key = std::move(k);
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(Json::array()); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t, const std::string&, const typename Json::exception&) { return false; }

  Json take() { return std::move(root_); }

 private:
  struct Level {
    Json* container;
    size_t count = 0;  // items (array) or members (object) so far
    string_t key;      // object: the member being read
  };

  // Stores v where the document is now; returns where it went (for a container that opens).
  Json* store(Json&& v) {
    if (++values_ > limits_.max_values) over(cat("holds more than ", limits_.max_values, " values in all"));
    if (levels_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Level& l = levels_.back();
    if (l.container->is_array()) {
      if (++l.count > limits_.max_array_items) over(cat("holds more than ", limits_.max_array_items, " items"), false);
      l.container->push_back(std::move(v));
      return &l.container->back();
    }
    Json& slot = (*l.container)[l.key];
    slot = std::move(v);
    return &slot;
  }

  bool put(Json&& v) {
    store(std::move(v));
    return true;
  }

  bool open(Json&& empty) {
    if (static_cast<int>(levels_.size()) >= limits_.max_depth)
      over(cat("is nested deeper than ", limits_.max_depth, " levels"));
    Json* c = store(std::move(empty));
    levels_.push_back({c, 0, {}});
    return true;
  }

  bool close() {
    levels_.pop_back();
    return true;
  }

  // The path of the value being read, as a request field ("tools[0].function.parameters"): at most
  // kShown components, without trailing array indices (a deep nest of arrays would only repeat them).
  // `member`: the member being read of the innermost container is part of it (else the container is
  // what is over a limit).
  std::string where(bool member) const {
    constexpr size_t kShown = 8;
    std::vector<std::string> parts;
    for (size_t i = 0; i < levels_.size() && parts.size() < kShown; ++i) {
      const Level& l = levels_[i];
      if (!member && i + 1 == levels_.size()) break;
      if (l.container->is_array()) parts.push_back(cat("[", l.count > 0 ? l.count - 1 : 0, "]"));
      else parts.push_back(std::string(l.key.begin(), l.key.end()));
    }
    while (!parts.empty() && parts.back().front() == '[') parts.pop_back();
    std::string path;
    for (const auto& p : parts) path += (path.empty() || p.front() == '[' ? "" : ".") + p;
    return path;
  }

  [[noreturn]] void over(const std::string& what, bool member = true) {
    const std::string w = where(member);
    throw JsonLimitError(w, cat(w.empty() ? std::string("the JSON document") : cat("'", w, "'"), " ", what,
                                " (a limit of the JSON parser)"));
  }

  const JsonLimits& limits_;
  Json root_;
  std::vector<Level> levels_;
  size_t values_ = 0;
};

}  // namespace

template <class Json>
Json parse_bounded(std::string_view text, const JsonLimits& limits) {
  BoundedBuilder<Json> builder(limits);
  if (!Json::sax_parse(text, &builder)) return Json(Json::value_t::discarded);
  return builder.take();
}

template nlohmann::json parse_bounded<nlohmann::json>(std::string_view, const JsonLimits&);
template nlohmann::ordered_json parse_bounded<nlohmann::ordered_json>(std::string_view, const JsonLimits&);

}  // namespace tern
