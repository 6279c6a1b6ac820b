// core/hex.h: bytes to lowercase hex and back, and what from_hex refuses.
#include "core/hex.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>

namespace tern {
namespace {

TEST(Hex, RoundTripsEveryByte) {
  std::array<unsigned char, 256> bytes{};
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(255 - i);
  const std::string s = to_hex(bytes.data(), bytes.size());
  ASSERT_EQ(s.size(), 512u);
  EXPECT_EQ(s.substr(0, 6), "fffefd");
  EXPECT_EQ(s.substr(506), "020100");
  std::array<unsigned char, 256> back{};
  ASSERT_TRUE(from_hex(s, back.data(), back.size()));
  EXPECT_EQ(back, bytes);
  EXPECT_EQ(to_hex(nullptr, 0), "");
}

TEST(Hex, RefusesMalformedDigits) {
  unsigned char out[2] = {};
  EXPECT_FALSE(from_hex("abc", out, 2));    // too short
  EXPECT_FALSE(from_hex("abcdef", out, 2)); // too long
  EXPECT_FALSE(from_hex("ABCD", out, 2));   // upper case is not what to_hex writes
  EXPECT_FALSE(from_hex("0g12", out, 2));
  EXPECT_TRUE(from_hex("0a1b", out, 2));
  EXPECT_EQ(out[0], 0x0a);
  EXPECT_EQ(out[1], 0x1b);
}

}  // namespace
}  // namespace tern
