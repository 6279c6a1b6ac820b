// The bounded JSON parser (core/bounded_json.h): documents within the limits parse as nlohmann's own
// parser reads them; over a limit they are refused while reading, naming the field; no depth crashes.
#include <gtest/gtest.h>

#include <string>

#include "core/bounded_json.h"

namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using tern::JsonLimitError;
using tern::JsonLimits;
using tern::parse_bounded;

std::string nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(BoundedJson, ParsesLikeNlohmann) {
  const std::string text =
      R"({"b": [1, -2, 3.5, "x", true, null, {"k": []}], "a": {"z": 1, "y": 18446744073709551615}, "b2": "\u00e9"})";
  EXPECT_EQ(parse_bounded<json>(text), json::parse(text));
  const auto o = parse_bounded<ordered_json>(text);
  EXPECT_EQ(o, ordered_json::parse(text));
  EXPECT_EQ(o.dump(), ordered_json::parse(text).dump());  // key order kept
  EXPECT_EQ(parse_bounded<json>(R"({"a": 1, "a": 2})")["a"], 2);  // the last duplicate wins, as nlohmann's
}

TEST(BoundedJson, MalformedTextIsDiscarded) {
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "{} x", "\"\\ud800\"", "nul", "[1] [2]"})
    EXPECT_TRUE(parse_bounded<json>(bad).is_discarded()) << bad;
}

TEST(BoundedJson, DepthIsBoundedWithoutRecursion) {
  JsonLimits l;
  l.max_depth = 8;
  EXPECT_NO_THROW(parse_bounded<json>(nested(8), l));
  EXPECT_THROW(parse_bounded<json>(nested(9), l), JsonLimitError);
  // Far beyond any stack: refused at the first level over, in constant stack.
  for (int depth : {100000, 1000000}) {
    try {
      parse_bounded<json>(R"({"tools": [{"function": {"parameters": )" + nested(depth) + "}}]}");
      FAIL() << "not refused";
    } catch (const JsonLimitError& e) {
      EXPECT_EQ(e.where, "tools[0].function.parameters");
      EXPECT_NE(std::string(e.what()).find("nested deeper than 64 levels"), std::string::npos) << e.what();
    }
  }
}

TEST(BoundedJson, SizesAreBoundedAndNamed) {
  JsonLimits l;
  l.max_string_bytes = 4;
  l.max_array_items = 3;
  l.max_object_members = 2;
  l.max_values = 20;
  EXPECT_NO_THROW(parse_bounded<json>(R"({"ab": "abcd", "c": [1, 2, 3]})", l));
  const auto where = [&](const std::string& text) {
    try {
      parse_bounded<json>(text, l);
    } catch (const JsonLimitError& e) {
      return e.where;
    }
    return std::string("not refused");
  };
  EXPECT_EQ(where(R"({"m": [{"c": "abcde"}]})"), "m[0].c");
  EXPECT_EQ(where(R"({"stop": 1, "abcde": 2})"), "");  // a key too long: the object holding it
  EXPECT_EQ(where(R"({"a": {"abcde": 1}})"), "a");
  EXPECT_EQ(where(R"({"stop": [1, 2, 3, 4]})"), "stop");
  EXPECT_EQ(where(R"({"a": 1, "b": 2, "c": 3})"), "");
  EXPECT_EQ(where(R"({"a": {"b": {"c": 1, "d": 2, "e": 3}}})"), "a.b");
  EXPECT_EQ(where(R"([[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2]])"), "");  // a fourth item at the top
  const std::string three = "[[1,1,1],[1,1,1],[1,1,1]]";                  // 13 values
  EXPECT_NO_THROW(parse_bounded<json>(three, l));
  try {
    parse_bounded<json>("[" + three + "," + three + "]", l);  // 27 values
    FAIL() << "not refused";
  } catch (const JsonLimitError& e) {
    EXPECT_NE(std::string(e.what()).find("more than 20 values in all"), std::string::npos) << e.what();
  }
}

}  // namespace
