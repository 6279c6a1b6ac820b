// The synthesizer: byte-identical output for a seed, and values that follow the documented formats
// (power-of-two scales within range, std ~ 1/sqrt(fan_in) after dequantization, distinct tid2eid), the MTP layer
// included.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/thread_pool.h"

#include "model/checkpoint.h"
#include "model/synth.h"
#include "model/weights.h"
#include "test_helpers.h"

namespace tern::model {
namespace {

using testing::read_file;
using testing::ScratchDir;

ModelConfig small_config() {
  ModelConfig c = ModelConfig::tiny();
  c.vocab_size = 512;
  return c;
}

std::vector<std::string> files_of(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& de : std::filesystem::directory_iterator(dir)) out.push_back(de.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Synth, SameSeedSameBytes) {
  ScratchDir a("syn-a"), b("syn-b"), c("syn-c");
  write_synthetic_checkpoint(small_config(), a.str(), 11, WeightFormat::nvfp4, 2);
  set_thread_count(1);  // the output must not depend on the number of threads
  write_synthetic_checkpoint(small_config(), b.str(), 11, WeightFormat::nvfp4, 2);
  set_thread_count(0);
  write_synthetic_checkpoint(small_config(), c.str(), 12, WeightFormat::nvfp4, 2);
  const auto files = files_of(a.str());
  ASSERT_EQ(files, (std::vector<std::string>{"config.json", "model-00001-of-00002.safetensors",
                                             "model-00002-of-00002.safetensors", "model.safetensors.index.json"}));
  ASSERT_EQ(files_of(b.str()), files);
  for (const auto& f : files) EXPECT_TRUE(read_file(a.file(f)) == read_file(b.file(f))) << f;
  EXPECT_FALSE(read_file(a.file(files[1])) == read_file(c.file(files[1])));
}

TEST(Synth, RewritingADirectoryReplacesTheOldCheckpoint) {
  ScratchDir a("syn");
  write_synthetic_checkpoint(small_config(), a.str(), 1, WeightFormat::mxfp4, 3);
  write_synthetic_checkpoint(small_config(), a.str(), 1, WeightFormat::mxfp4, 1);
  EXPECT_EQ(files_of(a.str()), (std::vector<std::string>{"config.json", "model.safetensors"}));
}

double fp8_dequant(const Linear& l, int64_t r, int64_t c) {
  const auto* w = l.weight.data_as<const uint8_t>();
  const auto* s = l.scale.data_as<const uint8_t>();
  return e4m3_to_f32(w[r * l.in + c]) * e8m0_to_f32(s[(r / 128) * l.scale.dim(1) + c / 128]);
}

double fp4_value(const Linear& l, int64_t r, int64_t c) {
  const uint8_t byte = l.weight.data_as<const uint8_t>()[(r * l.in + c) / 2];
  return e2m1_to_f32(c % 2 ? byte >> 4 : byte & 15);
}

struct Stats {
  double sum = 0, sum2 = 0;
  int64_t n = 0, zeros = 0;
  void add(double v) {
    sum += v;
    sum2 += v * v;
    ++n;
    zeros += v == 0;
  }
  double std() const { return std::sqrt(sum2 / n - (sum / n) * (sum / n)); }
};

TEST(Synth, ValuesFollowTheFormats) {
  ScratchDir dir("syn");
  const ModelConfig c = small_config();
  write_synthetic_checkpoint(c, dir.str(), 5, WeightFormat::mxfp4, 1);
  const ModelWeights w = load_model(dir.str());

  // FP8 block scales: powers of two by type, every block's amax within 448 * scale, and used.
  const Linear& wq = w.layers[1].attn.wq_b;
  Stats st;
  for (int64_t r = 0; r < wq.out; ++r)
    for (int64_t k = 0; k < wq.in; ++k) st.add(fp8_dequant(wq, r, k));
  EXPECT_NEAR(st.std() * std::sqrt(static_cast<double>(wq.in)), 1.0, 0.05);
  EXPECT_LT(static_cast<double>(st.zeros) / st.n, 0.01);
  for (int64_t i = 0; i < wq.scale.numel(); ++i) EXPECT_NE(wq.scale.data_as<const uint8_t>()[i], 0xff);

  // MXFP4: per-32 scale chosen so amax/scale is in (3, 6]: the largest magnitude code is 4 or 6.
  const Linear& e = w.layers[2].ffn.experts[1].w2;
  Stats se;
  for (int64_t r = 0; r < e.out; ++r)
    for (int64_t b = 0; b < e.in / 32; ++b) {
      double amax = 0;
      const double scale = e8m0_to_f32(e.scale.data_as<const uint8_t>()[r * (e.in / 32) + b]);
      for (int64_t k = b * 32; k < (b + 1) * 32; ++k) {
        const double v = fp4_value(e, r, k);
        amax = std::max(amax, std::fabs(v));
        se.add(v * scale);
      }
      EXPECT_GE(amax, 3.0);
    }
  EXPECT_NEAR(se.std() * std::sqrt(static_cast<double>(e.in)), 1.0, 0.08);

  // Norm weights near 1, tid2eid rows of distinct experts.
  const TensorView n = w.layers[0].attn_norm;
  for (int64_t i = 0; i < n.numel(); ++i) EXPECT_NEAR(bf16_to_f32(n.data_as<const uint16_t>()[i]), 1.0, 0.6);
  const TensorView t = w.layers[0].ffn.tid2eid;
  for (int64_t r = 0; r < t.dim(0); ++r) {
    const auto* row = t.data_as<const int64_t>() + r * t.dim(1);
    EXPECT_NE(row[0], row[1]) << r;
  }
  // No tensor is all zeros.
  const Checkpoint ck = Checkpoint::open(dir.str());
  for (const std::string& name : ck.names()) {
    const TensorView v = ck.get(name);
    const auto* p = static_cast<const uint8_t*>(v.data());
    bool nonzero = false;
    for (size_t i = 0; i < v.nbytes() && !nonzero; ++i) nonzero = p[i] != 0;
    EXPECT_TRUE(nonzero) << name;
  }
}

TEST(Synth, Nvfp4ScalesCoverTheBlocks) {
  ScratchDir dir("syn");
  const ModelConfig c = small_config();
  write_synthetic_checkpoint(c, dir.str(), 5, WeightFormat::nvfp4, 1);
  const ModelWeights w = load_model(dir.str());
  const Linear& e = w.layers[3].ffn.experts[2].w1;
  Stats s;
  for (int64_t r = 0; r < e.out; ++r)
    for (int64_t k = 0; k < e.in; ++k) {
      const uint8_t sc = e.scale.data_as<const uint8_t>()[r * (e.in / 16) + k / 16];
      ASSERT_LT(sc, 0x7f) << "ue4m3 scale out of range";
      s.add(fp4_value(e, r, k) * ue4m3_to_f32(sc) * e.global_scale);
    }
  EXPECT_NEAR(s.std() * std::sqrt(static_cast<double>(e.in)), 1.0, 0.08);
}

// The MTP layer mtp.0 as the official checkpoint has it (small_config mirrors V4-Flash: num_nextn_predict_layers 1,
// its compress ratio 0), so that loading the written checkpoint gives a model with MTP; none without it in the config.
TEST(Synth, WritesTheMtpLayer) {
  ScratchDir dir("syn");
  const ModelConfig c = small_config();
  ASSERT_EQ(c.num_mtp_layers, 1);
  write_synthetic_checkpoint(c, dir.str(), 6, WeightFormat::nvfp4, 2);
  const ModelWeights w = load_model(dir.str());
  ASSERT_TRUE(w.mtp.has_value());
  const MtpWeights& m = *w.mtp;
  EXPECT_EQ(w.config.num_mtp_layers, 1);
  EXPECT_EQ(m.block.index, c.num_layers);
  EXPECT_EQ(m.block.attn_kind, AttnKind::sliding);
  EXPECT_FALSE(m.block.attn.compressor.has_value());
  EXPECT_FALSE(m.block.hash_routed);
  EXPECT_EQ(m.block.ffn.experts[0].w2.format, WeightFormat::nvfp4);
  for (const Linear* l : {&m.e_proj, &m.h_proj, &m.block.attn.wq_b}) {
    EXPECT_EQ(l->format, WeightFormat::fp8_block) << l->name;
  }
  Stats st;
  for (int64_t r = 0; r < m.e_proj.out; ++r)
    for (int64_t k = 0; k < m.e_proj.in; ++k) st.add(fp8_dequant(m.e_proj, r, k));
  EXPECT_NEAR(st.std() * std::sqrt(static_cast<double>(m.e_proj.in)), 1.0, 0.05);
  EXPECT_EQ(m.hc_head.scale.shape(), (Shape{1}));

  // transformers' names: the block's tensors renamed as the trunk's ("model.mtp.0.*"), bound as such.
  ScratchDir hf("syn-hf");
  SynthOptions o;
  o.transformers_names = true;
  o.experts = WeightFormat::bf16;
  write_synthetic_checkpoint(c, hf.str(), o);
  const ModelWeights h = load_model(hf.str());
  ASSERT_TRUE(h.mtp.has_value());
  EXPECT_EQ(h.mtp->e_proj.format, WeightFormat::bf16);
  EXPECT_TRUE(Checkpoint::open(hf.str()).has("model.mtp.0.self_attn.q_a_proj.weight"));

  // Without num_nextn_predict_layers: no mtp.* tensors.
  ScratchDir none("syn-none");
  ModelConfig n = c;
  n.num_mtp_layers = 0;
  n.mtp_compress_ratios.clear();
  write_synthetic_checkpoint(n, none.str(), 6, WeightFormat::nvfp4, 1);
  EXPECT_FALSE(load_model(none.str()).mtp.has_value());
  for (const std::string& name : Checkpoint::open(none.str()).names()) EXPECT_NE(name.rfind("mtp.", 0), 0u) << name;

  // Only the sliding-window MTP layer (ratio 0) exists in tern.
  ModelConfig csa = c;
  csa.mtp_compress_ratios = {4};
  testing::expect_error([&] { write_synthetic_checkpoint(csa, none.str(), 6, WeightFormat::nvfp4, 1); },
                        {"synthetic MTP layer: its compress ratio is 4"});
}

TEST(Synth, RejectsBadOptions) {
  ScratchDir dir("syn");
  SynthOptions o;
  o.transformers_names = true;
  o.experts = WeightFormat::mxfp4;
  testing::expect_error([&] { write_synthetic_checkpoint(small_config(), dir.str(), o); },
                        {"transformers' names hold bf16 or f32 experts only"});
  ModelConfig bad = small_config();
  bad.o_groups = 3;
  testing::expect_error([&] { write_synthetic_checkpoint(bad, dir.str(), 1, WeightFormat::mxfp4, 1); },
                        {"synth config: field \"o_groups\""});
}

}  // namespace
}  // namespace tern::model
