// The two shape sets every GPU op test runs at: the test fixtures' tiny model (tools/reference/
// make_fixtures.py) and the real DeepSeek-V4-Flash.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace tern::gputest {

struct Shapes {
  const char* name;
  int64_t D, heads, head_dim, rope_dim, q_rank, groups, o_rank;
  int64_t experts, experts_per_token, inter;
  int64_t index_heads, index_dim, index_topk;
  int64_t window, vocab;
  int64_t csa_ratio, hca_ratio;
};

inline constexpr Shapes kFixture{"fixture", 256, 4, 256, 64, 128, 2, 64, 8, 2, 128, 4, 128, 4, 16, 512, 4, 8};
inline constexpr Shapes kV4Flash{"v4flash", 4096, 64, 512, 64, 1024, 8, 1024, 256, 6, 2048, 64, 128, 512, 128,
                                 129280, 4, 128};

inline std::ostream& operator<<(std::ostream& os, const Shapes& s) { return os << s.name; }

struct ShapeName {
  template <typename Info>
  std::string operator()(const Info& info) const {
    return info.param.name;
  }
};

}  // namespace tern::gputest
