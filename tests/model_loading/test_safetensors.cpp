// safetensors reading: a well-formed file round-trips through the writer; every malformed case is an
// error at open naming the file (and the tensor), never a crash.
#include <gtest/gtest.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstring>

#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"
#include "test_helpers.h"

namespace tern::model {
namespace {

using testing::expect_error;
using testing::read_file;
using testing::safetensors_bytes;
using testing::ScratchDir;
using testing::write_file;

std::vector<std::byte> bytes_of(const void* p, size_t n) {
  std::vector<std::byte> v(n);
  std::memcpy(v.data(), p, n);
  return v;
}

TEST(Safetensors, WriterRoundTripAlignedAndExact) {
  ScratchDir dir("st");
  SafetensorsWriter w;
  const float f[3] = {1.5f, -2.0f, 3.25f};
  const int64_t ids[2] = {7, -9};
  const uint16_t b[2] = {f32_to_bf16(0.5f), f32_to_bf16(-4.0f)};
  w.add_bytes("b.u8", DType::u8, Shape{3}, bytes_of("\x01\x02\x03", 3));  // odd size before wider types
  w.add_bytes("a.f32", DType::f32, Shape{3}, bytes_of(f, sizeof f));
  w.add_bytes("c.i64", DType::i64, Shape{2, 1}, bytes_of(ids, sizeof ids));
  w.add_bytes("d.bf16", DType::bf16, Shape{2}, bytes_of(b, sizeof b));
  w.add_bytes("e.f4", DType::e2m1, Shape{2, 2}, bytes_of("\x21\x43", 2));
  w.add_bytes("scalar", DType::f32, Shape{}, bytes_of(f, 4));
  w.add_bytes("empty", DType::bf16, Shape{0, 4}, {});
  w.set_metadata("format", "pt");
  w.write(dir.file("m.safetensors"));

  const auto st = SafetensorsFile::open(dir.file("m.safetensors"));
  EXPECT_EQ(st->entries().size(), 7u);
  EXPECT_EQ(st->metadata().at("format"), "pt");
  EXPECT_EQ(st->data_offset() % 8, 0u);
  for (const auto& e : st->entries()) {
    const TensorView v = st->view(e);
    const size_t align = std::max(1, dtype_bits(e.dtype) / 8);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % align, 0u) << e.name;
  }
  const TensorView a = st->view(*st->find("a.f32"));
  EXPECT_EQ(a.shape(), (Shape{3}));
  EXPECT_EQ(a.data_as<const float>()[2], 3.25f);
  EXPECT_EQ(st->view(*st->find("c.i64")).data_as<const int64_t>()[1], -9);
  EXPECT_EQ(bf16_to_f32(st->view(*st->find("d.bf16")).data_as<const uint16_t>()[1]), -4.0f);
  EXPECT_EQ(st->find("e.f4")->dtype, DType::e2m1);
  EXPECT_EQ(st->find("scalar")->shape.rank(), 0);
  EXPECT_EQ(st->find("nothing"), nullptr);
}

// --- malformed files: each a crafted file, each message names the file (and the tensor) -------------

class Malformed : public ::testing::Test {
 protected:
  ScratchDir dir{"bad"};
  std::string path = dir.file("model.safetensors");
  void open_expect(const std::vector<std::string>& parts) {
    std::vector<std::string> all = parts;
    all.push_back(path);
    expect_error([&] { SafetensorsFile::open(path); }, all);
  }
};

TEST_F(Malformed, EmptyFile) {
  write_file(path, "");
  open_expect({"not a safetensors file: 0 bytes"});
}

TEST_F(Malformed, ShorterThanTheLength) {
  write_file(path, "abc");
  open_expect({"not a safetensors file: 3 bytes"});
}

TEST_F(Malformed, HeaderLengthPastTheFile) {
  write_file(path, safetensors_bytes("{}", "", 1000000));
  open_expect({"header length 1000000 exceeds the file size"});
}

TEST_F(Malformed, HeaderLengthOverTheLimit) {
  const uint64_t n = kMaxSafetensorsHeaderBytes + 8;
  write_file(path, safetensors_bytes("{}", "", n));
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(n + 16)), 0);  // sparse: cheap
  open_expect({"exceeds the limit of"});
}

TEST_F(Malformed, HeaderNotJson) {
  write_file(path, safetensors_bytes("{\"a\": [1, 2", ""));
  open_expect({"the safetensors header is not valid JSON"});
}

TEST_F(Malformed, HeaderNotAnObject) {
  write_file(path, safetensors_bytes("[1, 2, 3]", ""));
  open_expect({"the safetensors header must be a JSON object, found array"});
}

TEST_F(Malformed, UnknownDtype) {
  write_file(path, safetensors_bytes(R"({"w": {"dtype": "F7", "shape": [2], "data_offsets": [0, 2]}})", "ab"));
  open_expect({"tensor \"w\"", "unknown dtype \"F7\""});
}

TEST_F(Malformed, MissingDtype) {
  write_file(path, safetensors_bytes(R"({"w": {"shape": [2], "data_offsets": [0, 2]}})", "ab"));
  open_expect({"tensor \"w\"", "expected a string \"dtype\""});
}

TEST_F(Malformed, NegativeShape) {
  write_file(path, safetensors_bytes(R"({"w": {"dtype": "U8", "shape": [-1, 2], "data_offsets": [0, 2]}})", "ab"));
  open_expect({"tensor \"w\"", "shape entries must be non-negative integers, found [-1,2]"});
}

TEST_F(Malformed, NonIntegerShape) {
  write_file(path, safetensors_bytes(R"({"w": {"dtype": "U8", "shape": [2.5], "data_offsets": [0, 2]}})", "ab"));
  open_expect({"tensor \"w\"", "shape entries must be non-negative integers, found [2.5]"});
}

TEST_F(Malformed, ShapeTooLarge) {
  write_file(path, safetensors_bytes(
                       R"({"w": {"dtype": "F32", "shape": [281474976710656, 281474976710656], "data_offsets": [0, 2]}})",
                       "ab"));
  open_expect({"tensor \"w\"", "is not a whole number of bytes (or is too large)"});
}

TEST_F(Malformed, OffsetsMissing) {
  write_file(path, safetensors_bytes(R"({"w": {"dtype": "U8", "shape": [2]}})", "ab"));
  open_expect({"tensor \"w\"", "expected \"data_offsets\": [begin, end]"});
}

TEST_F(Malformed, OffsetsNegative) {
  write_file(path, safetensors_bytes(R"({"w": {"dtype": "U8", "shape": [2], "data_offsets": [-2, 0]}})", "ab"));
  open_expect({"tensor \"w\"", "expected \"data_offsets\": [begin, end] with non-negative integers"});
}

TEST_F(Malformed, OffsetsReversed) {
  write_file(path, safetensors_bytes(R"({"w": {"dtype": "U8", "shape": [2], "data_offsets": [2, 0]}})", "ab"));
  open_expect({"tensor \"w\"", "end before they begin"});
}

TEST_F(Malformed, OffsetsOutOfBounds) {
  write_file(path, safetensors_bytes(R"({"w": {"dtype": "U8", "shape": [64], "data_offsets": [0, 64]}})", "abcd"));
  open_expect({"tensor \"w\"", "reach past the end of the data section (4 bytes)"});
}

TEST_F(Malformed, SizeMismatch) {
  write_file(path, safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})",
                                     std::string(16, 'x')));
  open_expect({"tensor \"w\"", "hold 12 bytes, but F32 [2, 2] needs 16"});
}

TEST_F(Malformed, OddNumberOfFp4Values) {
  write_file(path, safetensors_bytes(R"({"w": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}})", "ab"));
  open_expect({"tensor \"w\"", "is not a whole number of bytes"});
}

TEST_F(Malformed, OverlappingTensors) {
  write_file(path, safetensors_bytes(R"({"a": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]},
                                         "b": {"dtype": "U8", "shape": [16], "data_offsets": [8, 24]}})",
                                     std::string(24, 'x')));
  open_expect({"tensor \"b\"", "overlaps tensor \"a\""});
}

TEST_F(Malformed, MetadataNotAnObject) {
  write_file(path, safetensors_bytes(R"({"__metadata__": [1]})", ""));
  open_expect({"\"__metadata__\" must be a JSON object"});
}

TEST_F(Malformed, TruncatedData) {
  SafetensorsWriter w;
  w.add("w1", DType::f32, Shape{64}, nullptr);
  w.add("w2", DType::f32, Shape{64}, nullptr);
  w.write(path);
  const std::string full = read_file(path);
  write_file(path, full.substr(0, full.size() - 100));
  open_expect({"tensor \"w2\"", "reach past the end of the data section", "truncated"});
}

// --- checkpoints: index.json and shards -------------------------------------------------------------

void write_shard(const std::string& path, const std::vector<std::string>& names) {
  SafetensorsWriter w;
  for (const auto& n : names) w.add(n, DType::bf16, Shape{4}, nullptr);
  w.write(path);
}

TEST(Checkpoint, ShardedThroughTheIndex) {
  ScratchDir dir("ck");
  write_shard(dir.file("s1.safetensors"), {"a", "b"});
  write_shard(dir.file("s2.safetensors"), {"c"});
  write_file(dir.file("model.safetensors.index.json"),
             R"({"metadata": {"total_size": 24}, "weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors"}})");
  const Checkpoint ck = Checkpoint::open(dir.str());
  EXPECT_EQ(ck.size(), 3u);
  EXPECT_TRUE(ck.has("c"));
  EXPECT_FALSE(ck.has("d"));
  EXPECT_EQ(ck.file_of("c"), dir.file("s2.safetensors"));
  EXPECT_EQ(ck.get("a").shape(), (Shape{4}));
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ck.total_bytes(), 24u);
  EXPECT_EQ(ck.files().size(), 2u);
  expect_error([&] { ck.get("d"); }, {"model.safetensors.index.json", "tensor \"d\" is missing"});
}

TEST(Checkpoint, IndexPointsToAMissingShard) {
  ScratchDir dir("ck");
  write_shard(dir.file("s1.safetensors"), {"a"});
  write_file(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  expect_error([&] { Checkpoint::open(dir.str()); },
               {"model.safetensors.index.json", "shard \"s2.safetensors\"", "tensor \"b\"", "does not exist"});
}

TEST(Checkpoint, TensorMissingFromItsShard) {
  ScratchDir dir("ck");
  write_shard(dir.file("s1.safetensors"), {"a"});
  write_shard(dir.file("s2.safetensors"), {"b"});
  write_file(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})");
  expect_error([&] { Checkpoint::open(dir.str()); },
               {"model.safetensors.index.json", "tensor \"b\" is mapped to", "s1.safetensors", "does not contain it"});
}

TEST(Checkpoint, IndexShardOutsideTheDirectory) {
  ScratchDir dir("ck");
  write_file(dir.file("model.safetensors.index.json"), R"({"weight_map": {"a": "../x.safetensors"}})");
  expect_error([&] { Checkpoint::open(dir.str()); }, {"tensor \"a\"", "must be a file name in the checkpoint directory"});
}

TEST(Checkpoint, IndexNotJson) {
  ScratchDir dir("ck");
  write_file(dir.file("model.safetensors.index.json"), "{weight_map");
  expect_error([&] { Checkpoint::open(dir.str()); }, {"model.safetensors.index.json: not valid JSON"});
}

TEST(Checkpoint, CorruptShardNamesTheShard) {
  ScratchDir dir("ck");
  write_shard(dir.file("s1.safetensors"), {"a"});
  write_file(dir.file("s2.safetensors"), safetensors_bytes("nope", ""));
  write_file(dir.file("model.safetensors.index.json"), R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  expect_error([&] { Checkpoint::open(dir.str()); }, {"s2.safetensors", "not valid JSON"});
}

TEST(Checkpoint, FilesWithoutAnIndex) {
  ScratchDir dir("ck");
  write_shard(dir.file("x1.safetensors"), {"a"});
  write_shard(dir.file("x2.safetensors"), {"b"});
  EXPECT_EQ(Checkpoint::open(dir.str()).size(), 2u);
  write_shard(dir.file("x3.safetensors"), {"a"});
  expect_error([&] { Checkpoint::open(dir.str()); }, {"x3.safetensors", "tensor \"a\" is also in", "x1.safetensors"});
}

TEST(Checkpoint, EmptyDirectoryAndNotADirectory) {
  ScratchDir dir("ck");
  expect_error([&] { Checkpoint::open(dir.str()); }, {dir.str(), "no model.safetensors"});
  expect_error([&] { Checkpoint::open(dir.file("nope")); }, {"nope", "not a directory"});
}

}  // namespace
}  // namespace tern::model
