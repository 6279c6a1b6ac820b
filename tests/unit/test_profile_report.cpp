// The profiler's report on the CPU: every kernel of src/backends/cuda/kernels maps to its intended op
// category (names as the real build demangles them), unknown names land in "other", and the per-step table
// and JSON carry the right figures.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cuda/profile_report.h"

namespace tern::cuda {
namespace {

using C = OpCategory;

struct Expect {
  const char* demangled;  // as abi::__cxa_demangle prints the device symbol of the real build
  C category;
};

// One entry per kernel (and per template shape where the name differs), from the symbols of
// build-cuda/src/backends/cuda (nvcc 13.0, sm_90a).
const std::vector<Expect> kCurrentKernels = {
    {"void tern::cuda::dev::(anonymous namespace)::attention_kernel<1>(tern::cuda::AttentionParams, int, long)", C::attention},
    {"void tern::cuda::dev::(anonymous namespace)::attention_kernel<4>(tern::cuda::AttentionParams, int, long)", C::attention},
    {"void tern::cuda::dev::(anonymous namespace)::attention_mma_kernel<512>(tern::cuda::AttentionParams, long)", C::attention},
    {"void tern::cuda::dev::(anonymous namespace)::attention_heads_kernel<512, 1>(tern::cuda::AttentionParams, long)", C::attention},
    {"tern::cuda::dev::(anonymous namespace)::attention_combine_kernel(tern::cuda::AttentionParams, int, long)", C::attention},
    {"tern::cuda::dev::(anonymous namespace)::attention_any_kernel(tern::cuda::AttentionParams)", C::attention},
    {"tern::cuda::dev::(anonymous namespace)::kv_pack_kernel(float const*, tern::cuda::KvRowDesc, unsigned char*)", C::attention},
    {"tern::cuda::dev::(anonymous namespace)::kv_unpack_kernel(unsigned char const*, long, tern::cuda::KvRowDesc, float*)", C::attention},
    {"tern::cuda::dev::(anonymous namespace)::store_rows_kernel(tern::cuda::StoreRowsParams)", C::attention},
    {"tern::cuda::dev::(anonymous namespace)::indexer_scores_kernel(tern::cuda::IndexerParams, float*)", C::indexer},
    {"tern::cuda::dev::(anonymous namespace)::indexer_topk_kernel(tern::cuda::IndexerParams, float const*, int, int*)", C::indexer},
    {"tern::cuda::dev::(anonymous namespace)::compressor_kernel(tern::cuda::CompressorParams)", C::compressor},
    {"void tern::cuda::dev::(anonymous namespace)::compressor_emit_kernel<16>(tern::cuda::CompressEmitParams)", C::compressor},
    {"tern::cuda::dev::(anonymous namespace)::moe_plan_kernel(int const*, long, long, int, int*, int*, int*, int*, int*)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::moe_plan_kernel_small(int const*, long, long, int, int*, int*, int*, int*, int*)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::moe_prep_kernel(tern::cuda::dev::(anonymous namespace)::PrepArgs)", C::moe},
    {"void tern::cuda::dev::moe_expert_kernel<(tern::ops::WeightFormat)3, 1, true>(tern::cuda::dev::MoeArgs)", C::moe},
    {"void tern::cuda::dev::moe_expert_kernel<(tern::ops::WeightFormat)4, 2, false>(tern::cuda::dev::MoeArgs)", C::moe},
    {"void tern::cuda::dev::moe_expert_kernel<(tern::ops::WeightFormat)4, 4, false>(tern::cuda::dev::MoeArgs)", C::moe},
    {"void tern::cuda::dev::moe_bulk_kernel<(tern::ops::WeightFormat)3, true>(tern::cuda::dev::MoeBulkArgs)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::moe_exact_kernel(tern::cuda::MoeParams, float*, int*)", C::moe},
    {"void tern::cuda::dev::moe_bulk_kernel<(tern::ops::WeightFormat)4, false>(tern::cuda::dev::MoeBulkArgs)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::moe_combine_kernel(float const*, int const*, float const*, long, int, long, float*)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::route_scored_kernel(float const*, float const*, long, long, int, float, int*, float*)", C::moe},
    {"void tern::cuda::dev::(anonymous namespace)::route_scored_regs_kernel<8>(float const*, float const*, long, long, int, float, int*, float*, int*)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::l2_prefetch_kernel(unsigned char const*, long)", C::dense_gemm},
    {"tern::cuda::dev::(anonymous namespace)::route_hash_kernel(float const*, void const*, int, long, long const*, long, long, int, float, int*, float*, int*)", C::moe},
    {"void tern::cuda::dev::linear_mma_kernel<(tern::ops::WeightFormat)2, 1>(tern::cuda::dev::LinearArgs)", C::dense_gemm},
    {"void tern::cuda::dev::linear_stream_kernel<(tern::ops::WeightFormat)2, 2, 1>(tern::cuda::dev::StreamArgs)", C::dense_gemm},
    {"void tern::cuda::dev::linear_mma_kernel<(tern::ops::WeightFormat)1, 4>(tern::cuda::dev::LinearArgs)", C::dense_gemm},
    {"tern::cuda::dev::(anonymous namespace)::linear_exact_rows_kernel(tern::cuda::dev::(anonymous namespace)::SimpleMat, float const*, long, long, long, int, float*)", C::dense_gemm},
    {"tern::cuda::dev::(anonymous namespace)::linear_exact_lanes_kernel(tern::cuda::dev::(anonymous namespace)::SimpleMat, float const*, long, long, long, float*, float*, int*)", C::dense_gemm},
    {"void tern::cuda::dev::(anonymous namespace)::linear_exact_tc_kernel<true>(tern::cuda::dev::(anonymous namespace)::TcArgs)", C::dense_gemm},
    {"void tern::cuda::dev::(anonymous namespace)::norm_rope_kernel<16>(float const*, long, void const*, tern::cuda::NormWeight, float, long, long, long, long const*, float const*, long, float*)", C::mhc_norm_rope},
    {"void tern::cuda::dev::linear_bulk_kernel<(tern::ops::WeightFormat)1, 2>(tern::cuda::dev::BulkLinArgs)", C::dense_gemm},
    {"void tern::cuda::dev::linear_x_window_kernel<(tern::ops::WeightFormat)2>(float const*, long, long, long, unsigned char*)", C::dense_gemm},
    {"tern::cuda::dev::(anonymous namespace)::linear_simple_kernel(tern::cuda::dev::(anonymous namespace)::SimpleMat, float const*, long, long, long, float*)", C::dense_gemm},
    {"void tern::cuda::dev::(anonymous namespace)::hc_mix_kernel<4>(float const*, float const*, long, long, float*)", C::mhc_norm_rope},
    {"void tern::cuda::dev::(anonymous namespace)::hc_mix_kernel<24>(float const*, float const*, long, long, float*)", C::mhc_norm_rope},
    {"tern::cuda::dev::(anonymous namespace)::hc_pre_finish_kernel(tern::cuda::HcParams, int)", C::mhc_norm_rope},
    {"tern::cuda::dev::(anonymous namespace)::hc_comb_kernel(tern::cuda::HcParams)", C::mhc_norm_rope},
    {"tern::cuda::dev::(anonymous namespace)::hc_head_finish_kernel(tern::cuda::HcParams, int)", C::mhc_norm_rope},
    {"tern::cuda::dev::(anonymous namespace)::hc_post_kernel(float const*, float const*, float const*, float const*, long, long, long, float*)", C::mhc_norm_rope},
    {"tern::cuda::dev::(anonymous namespace)::hc_expand_kernel(float const*, long, long, long, float*)", C::mhc_norm_rope},
    {"tern::cuda::dev::(anonymous namespace)::rms_norm_warp_kernel(float const*, void const*, tern::cuda::NormWeight, float, long, long, float*)", C::mhc_norm_rope},
    {"void tern::cuda::dev::(anonymous namespace)::rms_norm_row_kernel<16>(float const*, void const*, tern::cuda::NormWeight, float, long, float*)", C::mhc_norm_rope},
    {"tern::cuda::dev::(anonymous namespace)::rms_norm_block_kernel(float const*, void const*, tern::cuda::NormWeight, float, long, float*)", C::mhc_norm_rope},
    {"tern::cuda::dev::(anonymous namespace)::rope_kernel(float*, long, long, long, long const*, float const*, long, int)", C::mhc_norm_rope},
    {"tern::cuda::dev::(anonymous namespace)::sample_rows_kernel(float const*, int, unsigned char const*, int, float*, tern::sampling::SampledRow*)", C::sampling},
    {"tern::cuda::dev::(anonymous namespace)::embedding_kernel(void const*, int, long, long, long const*, long, float*, int*)", C::other},
    {"tern::cuda::dev::(anonymous namespace)::add_kernel(float const*, float*, long)", C::other},
    {"tern::cuda::dev::(anonymous namespace)::swiglu_kernel(float const*, float const*, float, float*, long)", C::other},
    {"tern::cuda::dev::(anonymous namespace)::gather_rows_kernel(float const*, long, long, long const*, long, float*, int*)", C::other},
    {"tern::cuda::dev::(anonymous namespace)::dequantize_kernel(tern::cuda::dev::(anonymous namespace)::SimpleMat, float*)", C::other},
    {"tern::cuda::dev::(anonymous namespace)::synth_values_kernel(bool, unsigned long, float, float, void*, bool, long)", C::other},
    {"tern::cuda::dev::(anonymous namespace)::synth_fp8_kernel(unsigned long, float, long, long, unsigned char*, unsigned char*)", C::other},
    {"void tern::cuda::dev::(anonymous namespace)::synth_fp4_kernel<true>(unsigned long, float, float, long, unsigned char*, unsigned char*)", C::other},
    {"tern::cuda::dev::(anonymous namespace)::synth_distinct_rows_kernel(unsigned long, long, int, long, long*)", C::other},
    {"void tern::cuda::dev::(anonymous namespace)::expand_kernel<unsigned short, false>(tern::cuda::dev::(anonymous namespace)::Mat16, long, unsigned short*)", C::dense_gemm},
    {"tern::cuda::dev::(anonymous namespace)::round_bf16_kernel(float const*, long, long, long, unsigned short*)", C::dense_gemm},
    {"tern::cuda::dev::(anonymous namespace)::split_bf16x3_kernel(float const*, long, long, long, unsigned short*)", C::dense_gemm},
    {"void tern::cuda::dev::act_quant_kernel<(tern::cuda::dev::ActOut)0>(tern::cuda::ActRows, tern::cuda::dev::ActOutArgs)", C::dense_gemm},
    {"tern::cuda::dev::act_dequant_kernel(unsigned char const*, float const*, long, long, long, float*)", C::dense_gemm},
    {"void tern::cuda::dev::linear_x8_kernel<64, false>(tern::cuda::dev::X8Args)", C::dense_gemm},
    {"void tern::cuda::dev::linear_x8_kernel<8, true>(tern::cuda::dev::X8Args)", C::dense_gemm},
    {"tern::cuda::dev::act_fake_quant_bf16_kernel(tern::cuda::Bf16Rows)", C::moe},
    {"tern::cuda::dev::act_fake_quant_bf16_planes_kernel(tern::cuda::Bf16Rows)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::block_scales_f32_kernel(unsigned char const*, int, long, long, long, float*)", C::dense_gemm},
    {"void tern::cuda::dev::(anonymous namespace)::attention_prefill_kernel<512>(tern::cuda::AttentionParams)", C::attention},
    {"void tern::cuda::dev::(anonymous namespace)::attention_prefill_wgmma_kernel<512, true>(tern::cuda::AttentionParams, long)", C::attention},
    {"void tern::cuda::dev::(anonymous namespace)::attention_prefill_ws_kernel<512>(tern::cuda::AttentionParams, long)", C::attention},
    {"void tern::cuda::dev::(anonymous namespace)::attention_prefill_ws_kernel<512, true>(tern::cuda::AttentionParams, long)", C::attention},
    {"void tern::cuda::dev::(anonymous namespace)::attention_kv_bf16_kernel(tern::cuda::AttentionParams, unsigned char*)", C::attention},
    {"tern::cuda::dev::(anonymous namespace)::wgmma_probe_kernel(float const*, float const*, float*, float*)", C::other},
    {"void tern::cuda::dev::(anonymous namespace)::moe_grouped_kernel<(tern::ops::WeightFormat)3, 64, true>(tern::cuda::dev::(anonymous namespace)::GroupedArgs)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::moe_grouped_gather_kernel(float const*, int const*, long, int, long, unsigned short*)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::moe_grouped_tiles_kernel(int const*, int const*, int, int*)", C::moe},
    {"void tern::cuda::dev::(anonymous namespace)::moe_grouped_wgmma_kernel<(tern::ops::WeightFormat)3, true, 112>(tern::cuda::dev::(anonymous namespace)::WgArgs)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::moe_grouped_wgmma_gather_kernel(float const*, int const*, long, int, long, unsigned short*)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::moe_grouped_wgmma_tiles_kernel(int const*, int const*, int, int*)", C::moe},
    {"void tern::cuda::dev::(anonymous namespace)::moe_grouped_e4m3_kernel<true, 64>(tern::cuda::dev::(anonymous namespace)::E4Args)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::moe_e4m3_gather_kernel(float const*, int const*, long, int, long, long, unsigned char*, float*)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::moe_e4m3_h_kernel(unsigned short const*, long, long, long, unsigned char*, float*)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::moe_e4m3_fold_check_kernel(tern::cuda::ExpertDesc const*, long, long, int*)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::moe_expand_kernel(tern::cuda::ExpertDesc const*, tern::ops::WeightFormat, int, int const*, int, long, long, unsigned short*)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::moe_gather_bf16_kernel(float const*, int const*, long, int, long, unsigned short*)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::moe_swiglu_bf16_kernel(float const*, long, long, float, unsigned short*)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::fill_random_bf16_kernel(unsigned short*, long, float, unsigned long)", C::other},
    {"tern::cuda::dev::(anonymous namespace)::fill_random_e4m3_kernel(unsigned char*, long, unsigned long)", C::other},
    {"tern::cuda::dev::(anonymous namespace)::bulk_read_kernel(unsigned char const*, long, int, int, int, int, unsigned int*)", C::other},
    {"tern::cuda::dev::(anonymous namespace)::ldg_read_kernel(uint4 const*, long, int, unsigned int*)", C::other},
    {"void tern::cuda::dev::(anonymous namespace)::tile_read_kernel<3>(unsigned char const*, long, int, int, int, unsigned int*)", C::other},
    {"void tern::cuda::dev::(anonymous namespace)::fp4_decode_probe_kernel<3, 2>(unsigned char const*, long, int, unsigned int*, unsigned int const*, float*)", C::other},
    {"tern::cuda::dev::(anonymous namespace)::pdl_fence_kernel(int)", C::other},
    {"tern::cuda::dev::(anonymous namespace)::indexer_gather_keys_kernel(tern::cuda::PagedRowsDesc, long, long, float*)", C::indexer},
    {"tern::cuda::dev::(anonymous namespace)::indexer_reduce_kernel(tern::cuda::IndexerParams, float const*, long, long, float*)", C::indexer},
    {"void tern::cuda::dev::(anonymous namespace)::indexer_mma_kernel<tern::cuda::dev::(anonymous namespace)::Bf16x6>(tern::cuda::IndexerParams, float*, int, long)", C::indexer},
    {"tern::cuda::dev::(anonymous namespace)::hc_squares_kernel(float const*, long, long, float*)", C::mhc_norm_rope},
    {"void tern::cuda::dev::(anonymous namespace)::hc_post_squares_kernel<4>(float const*, float const*, float const*, float const*, long, float*, float*, long)", C::mhc_norm_rope},
    {"tern::cuda::dev::(anonymous namespace)::moe_sort_count_kernel(int const*, long, long, int*, int*)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::moe_sort_offsets_kernel(int*, int, long, int*, int*)", C::moe},
    {"tern::cuda::dev::(anonymous namespace)::moe_sort_scatter_kernel(int const*, long, long, int const*, int*, int*)", C::moe},
    {"void sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", C::dense_gemm},
};

TEST(ProfileReport, EveryCurrentKernelHasItsCategory) {
  for (const Expect& e : kCurrentKernels) {
    const KernelClass k = classify_kernel(e.demangled);
    EXPECT_TRUE(k.matched) << e.demangled;
    EXPECT_EQ(category_name(k.category), category_name(e.category)) << e.demangled;
  }
}

// Mangled device symbols as CUPTI reports them (nvcc renames anonymous namespaces per file).
TEST(ProfileReport, DemanglesDeviceSymbols) {
  EXPECT_EQ(demangle("_ZN4tern4cuda3dev38_GLOBAL__N__51d87af5_6_moe_cu_83ac718215moe_plan_kernelEPKilliPiS5_S5_S5_S5_"),
            "tern::cuda::dev::(anonymous namespace)::moe_plan_kernel(int const*, long, long, int, int*, int*, int*, int*, int*)");
  const std::string mma = demangle("_ZN4tern4cuda3dev17linear_mma_kernelILNS_3ops12WeightFormatE3ELi4EEEvNS1_10LinearArgsE");
  EXPECT_EQ(mma, "void tern::cuda::dev::linear_mma_kernel<(tern::ops::WeightFormat)3, 4>(tern::cuda::dev::LinearArgs)");
  EXPECT_EQ(kernel_display_name(mma), "linear_mma_kernel<mxfp4, 4>");
  EXPECT_EQ(categorize_kernel(mma), C::dense_gemm);
  const std::string mix = demangle("_ZN4tern4cuda3dev38_GLOBAL__N__c693f939_6_mhc_cu_11c122a0L13hc_mix_kernelILi24EEEvPKfS5_llPf");
  EXPECT_EQ(kernel_base_name(mix), "hc_mix_kernel");
  EXPECT_EQ(kernel_display_name(mix), "hc_mix_kernel<24>");
  // Not mangled: unchanged.
  EXPECT_EQ(demangle("my_c_kernel"), "my_c_kernel");
  EXPECT_EQ(demangle("[memcpy HtoD]"), "[memcpy HtoD]");
}

TEST(ProfileReport, NamesForTables) {
  EXPECT_EQ(kernel_base_name("void tern::cuda::dev::(anonymous namespace)::attention_kernel<4>(tern::cuda::AttentionParams, int, long)"),
            "attention_kernel");
  EXPECT_EQ(kernel_display_name("void tern::cuda::dev::(anonymous namespace)::attention_kernel<4>(tern::cuda::AttentionParams, int, long)"),
            "attention_kernel<4>");
  EXPECT_EQ(kernel_display_name("void tern::cuda::dev::moe_expert_kernel<(tern::ops::WeightFormat)3, 1, true>(tern::cuda::dev::MoeArgs)"),
            "moe_expert_kernel<mxfp4, 1, true>");
  EXPECT_EQ(kernel_display_name("tern::cuda::dev::(anonymous namespace)::rope_kernel(float*, long, long, long, long const*, float const*, long, int)"),
            "rope_kernel");
  EXPECT_EQ(kernel_base_name("plain_kernel"), "plain_kernel");
  EXPECT_EQ(kernel_base_name("void lib::gemm_impl<float (&) [2]>(float (&) [2], int)"), "gemm_impl");
  EXPECT_EQ(kernel_display_name("[memset]"), "[memset]");
}

TEST(ProfileReport, UnknownNamesLandInOther) {
  for (const char* name : {"my_new_kernel", "void foo::bar<3>(int)", "", "_Znot_a_symbol", "tern::cuda::dev::(anonymous namespace)::fused_thing(float*)",
                           "[unnamed kernel]", "xattention_kernel(int)"}) {
    const KernelClass k = classify_kernel(name);
    EXPECT_FALSE(k.matched) << name;
    EXPECT_EQ(k.category, C::other) << name;
  }
}

TEST(ProfileReport, CopiesAndFutureFamilies) {
  for (const char* name : {"[memcpy HtoD]", "[memcpy DtoH]", "[memcpy DtoD]", "[memset]"})
    EXPECT_EQ(categorize_kernel(name), C::memcpy) << name;
  EXPECT_EQ(categorize_kernel("void tern::cuda::dev::sample_topp_kernel<8>(float const*)"), C::sampling);
  EXPECT_EQ(categorize_kernel("argmax_kernel(float const*, int*)"), C::sampling);
  EXPECT_EQ(categorize_kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"), C::dense_gemm);
  EXPECT_EQ(categorize_kernel("nvjet_tst_128x64_64x6_1x1_v_bz_TNT"), C::dense_gemm);
  EXPECT_EQ(categorize_kernel("void tern::cuda::dev::attention_mla_kernel<64>(int)"), C::attention);
}

// Kernel names declared in the sources: `__global__ void [__launch_bounds__(...)] name(`.
std::set<std::string> kernels_in_sources() {
  namespace fs = std::filesystem;
  std::set<std::string> names;
  const fs::path dir = fs::path(TERN_SOURCE_DIR) / "src/backends/cuda/kernels";
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".cu" && ext != ".cuh") continue;
    std::ifstream in(entry.path());
    std::stringstream buf;
    buf << in.rdbuf();
    const std::string s = buf.str();
    for (size_t at = s.find("__global__"); at != std::string::npos; at = s.find("__global__", at + 1)) {
      size_t i = at + std::string("__global__").size();
      std::string word;
      while (i < s.size()) {
        while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
        size_t j = i;
        while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
        word = s.substr(i, j - i);
        i = j;
        if (word == "void") continue;
        if (word == "__launch_bounds__") {  // skip its balanced (...)
          int depth = 0;
          for (; i < s.size(); ++i) {
            if (s[i] == '(') ++depth;
            if (s[i] == ')' && --depth == 0) {
              ++i;
              break;
            }
          }
          continue;
        }
        break;
      }
      if (!word.empty()) names.insert(word);
    }
  }
  return names;
}

TEST(ProfileReport, EveryKernelInTheSourcesIsMappedOnPurpose) {
  const std::set<std::string> in_sources = kernels_in_sources();
  ASSERT_GE(in_sources.size(), 25u) << "did the kernel scan find " << TERN_SOURCE_DIR << "/src/backends/cuda/kernels?";
  std::set<std::string> in_table;
  for (const Expect& e : kCurrentKernels) in_table.insert(kernel_base_name(e.demangled));
  for (const std::string& name : in_sources) {
    EXPECT_TRUE(classify_kernel(name).matched) << name << ": a new kernel needs a rule in profile_report.cpp";
    EXPECT_TRUE(in_table.count(name)) << name << ": add it with its category to kCurrentKernels in this test";
  }
}

// kernel_display_name writes the kernels' ops::WeightFormat template arguments out by name.
TEST(ProfileReport, WeightFormatNamesFollowTheEnum) {
  EXPECT_EQ(kernel_display_name("void tern::cuda::dev::linear_mma_kernel<(tern::ops::WeightFormat)2, 2>(x)"), "linear_mma_kernel<fp8, 2>");
  EXPECT_EQ(kernel_display_name("void tern::cuda::dev::linear_mma_kernel<(tern::ops::WeightFormat)3, 2>(x)"), "linear_mma_kernel<mxfp4, 2>");
  EXPECT_EQ(kernel_display_name("void tern::cuda::dev::linear_mma_kernel<(tern::ops::WeightFormat)0, 2>(x)"), "linear_mma_kernel<f32, 2>");
  EXPECT_EQ(kernel_display_name("void tern::cuda::dev::linear_mma_kernel<(tern::ops::WeightFormat)4, 2>(x)"), "linear_mma_kernel<nvfp4, 2>");
  EXPECT_EQ(kernel_display_name("void tern::cuda::dev::linear_mma_kernel<(tern::ops::WeightFormat)9, 2>(x)"), "linear_mma_kernel<(WeightFormat)9, 2>");
}

// Two steps of a made-up profile: attention 2 x 3000 ns, one linear 4 x 1000 ns, a copy 2 x 500 ns, one
// unknown kernel 2 x 250 ns.
ProfileRecords sample_records() {
  ProfileRecords r;
  r.kernels = {
      {"void tern::cuda::dev::(anonymous namespace)::attention_kernel<4>(tern::cuda::AttentionParams, int, long)", 2, 6000, 2},
      {"void tern::cuda::dev::linear_mma_kernel<(tern::ops::WeightFormat)2, 1>(tern::cuda::dev::LinearArgs)", 4, 4000, 0},
      {"[memcpy DtoH]", 2, 1000, 0},
      {"mystery_kernel", 2, 500, 0},
  };
  r.busy_ns = 11500;
  r.span_ns = 23000;
  return r;
}

TEST(ProfileReport, CategorizeSumsPerCategory) {
  const ProfileReport rep = categorize(sample_records());
  EXPECT_EQ(rep.total_ns, 11500);
  EXPECT_EQ(rep.categories[static_cast<int>(C::attention)].total_ns, 6000);
  EXPECT_EQ(rep.categories[static_cast<int>(C::attention)].count, 2);
  EXPECT_EQ(rep.categories[static_cast<int>(C::dense_gemm)].total_ns, 4000);
  EXPECT_EQ(rep.categories[static_cast<int>(C::dense_gemm)].count, 4);
  EXPECT_EQ(rep.categories[static_cast<int>(C::memcpy)].total_ns, 1000);
  EXPECT_EQ(rep.categories[static_cast<int>(C::other)].total_ns, 500);
  EXPECT_EQ(rep.categories[static_cast<int>(C::moe)].total_ns, 0);
  ASSERT_EQ(rep.kernels.size(), 4u);
  EXPECT_EQ(rep.kernels[0].display, "attention_kernel<4>");
  EXPECT_EQ(rep.kernels[1].display, "linear_mma_kernel<fp8, 1>");
  EXPECT_EQ(rep.kernels[3].display, "mystery_kernel");
}

TEST(ProfileReport, TableIsPerStep) {
  const std::string t = format_report(categorize(sample_records()), 2, 3, "decode step");
  // attention: 6000 ns / 2 steps = 3.0 us, 6000 / 11500 = 52.2 %, 1 kernel per step.
  EXPECT_NE(t.find("| attention | 3.0 | 52.2% | 1 |"), std::string::npos) << t;
  EXPECT_NE(t.find("| dense gemm | 2.0 | 34.8% | 2 |"), std::string::npos) << t;
  EXPECT_NE(t.find("| memcpy/memset | 0.5 | 8.7% | 1 |"), std::string::npos) << t;
  EXPECT_NE(t.find("| other | 0.2 | 4.3% | 1 |"), std::string::npos) << t;  // 0.25 rounds to even
  EXPECT_NE(t.find("| moe experts | 0.0 | 0.0% | 0 |"), std::string::npos) << t;
  EXPECT_NE(t.find("| total | 5.8 | 100.0% | 5 |"), std::string::npos) << t;
  EXPECT_NE(t.find("GPU busy 5.8 us of 11.5 us wall per decode step (50.0%"), std::string::npos) << t;
  // Top 3 of 4: the unknown kernel (smallest) is not listed; us/call = 3000 ns.
  EXPECT_NE(t.find("| attention_kernel<4> | attention | 3.0 | 52.2% | 1 | 3.0 |"), std::string::npos) << t;
  EXPECT_NE(t.find("| linear_mma_kernel<fp8, 1> | dense gemm | 2.0 | 34.8% | 2 | 1.0 |"), std::string::npos) << t;
  EXPECT_EQ(t.find("| mystery_kernel |"), std::string::npos) << t;
  EXPECT_EQ(t.find("WARNING"), std::string::npos) << t;
}

TEST(ProfileReport, TableWarnsOfDroppedRecords) {
  ProfileRecords r = sample_records();
  r.dropped = 7;
  r.bad_timestamps = 2;
  const std::string t = format_report(categorize(r), 1);
  EXPECT_NE(t.find("WARNING: CUPTI dropped 7 activity records"), std::string::npos) << t;
  EXPECT_NE(t.find("WARNING: 2 records had no valid timestamps"), std::string::npos) << t;
}

TEST(ProfileReport, JsonCarriesTheSameFigures) {
  const nlohmann::json j = nlohmann::json::parse(format_report_json(categorize(sample_records()), 2, 10));
  EXPECT_EQ(j["steps"], 2);
  EXPECT_DOUBLE_EQ(j["total_us_per_step"].get<double>(), 5.75);
  EXPECT_DOUBLE_EQ(j["gpu_busy_us_per_step"].get<double>(), 5.75);
  EXPECT_DOUBLE_EQ(j["wall_us_per_step"].get<double>(), 11.5);
  ASSERT_EQ(j["categories"].size(), static_cast<size_t>(kNumOpCategories));
  std::map<std::string, double> us;
  double shares = 0;
  for (const auto& c : j["categories"]) {
    us[c["name"].get<std::string>()] = c["us_per_step"].get<double>();
    shares += c["share"].get<double>();
  }
  EXPECT_DOUBLE_EQ(us["attention"], 3.0);
  EXPECT_DOUBLE_EQ(us["dense gemm"], 2.0);
  EXPECT_DOUBLE_EQ(us["memcpy/memset"], 0.5);
  EXPECT_DOUBLE_EQ(us["other"], 0.25);
  EXPECT_NEAR(shares, 1.0, 1e-12);
  ASSERT_EQ(j["kernels"].size(), 4u);
  EXPECT_EQ(j["kernels"][0]["name"], "attention_kernel<4>");
  EXPECT_EQ(j["kernels"][0]["category"], "attention");
  EXPECT_DOUBLE_EQ(j["kernels"][0]["graph_calls_per_step"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["kernels"][1]["calls_per_step"].get<double>(), 2.0);
}

// A PDL chain on one stream: each kernel starts (and waits) before its predecessor ends, so own times add up
// to more than the step; the exposed times are the ends' distances and add up to the busy time.
TEST(ProfileReport, ExposedTimeOfAPdlChain) {
  // owner 0: [100, 200], owner 1 starts at 150 (waiting) and ends at 230, owner 2: [225, 400], owner 1 again
  // [390, 420]; then an idle gap and owner 0 [500, 510].
  const std::vector<ActivitySpan> chain = {{100, 200, 0}, {150, 230, 1}, {225, 400, 2}, {390, 420, 1}, {500, 510, 0}};
  const std::vector<int64_t> e = expose(chain, 3);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0], 100 + 10);
  EXPECT_EQ(e[1], 30 + 20);
  EXPECT_EQ(e[2], 170);
  EXPECT_EQ(e[0] + e[1] + e[2], (420 - 100) + (510 - 500));  // the union: [100, 420] and [500, 510]
  // The order the records arrive in does not matter.
  const std::vector<ActivitySpan> shuffled = {chain[3], chain[0], chain[4], chain[2], chain[1]};
  EXPECT_EQ(expose(shuffled, 3), e);
}

// Concurrent branches: a short span ending inside a longer one takes the part after its start; the part of
// the longer one before the shorter one's start is credited to nobody (documented in profile_report.h).
TEST(ProfileReport, ExposedTimeOfConcurrentSpans) {
  const std::vector<int64_t> e = expose({{0 + 1, 100, 0}, {40, 60, 1}}, 2);
  EXPECT_EQ(e[1], 20);
  EXPECT_EQ(e[0], 40);
  EXPECT_THROW(expose({{1, 2, 2}}, 2), std::exception);
  EXPECT_THROW(expose({{1, 2, -1}}, 2), std::exception);
  EXPECT_EQ(expose({}, 2), (std::vector<int64_t>{0, 0}));
}

TEST(ProfileReport, TableShowsExposedTimeWhenRecorded) {
  ProfileRecords r = sample_records();
  const std::string plain = format_report(categorize(r), 2, 3);
  EXPECT_EQ(plain.find("exposed"), std::string::npos) << plain;  // records without spans: no column
  r.kernels[0].exposed_ns = 5000;  // attention: 2.5 us a step, 2.5 us a call
  r.kernels[1].exposed_ns = 200;
  r.kernels[3].exposed_ns = 480;  // the unknown kernel: last by GPU time, second by exposed time
  const std::string t = format_report(categorize(r), 2, 3, "decode step");
  EXPECT_NE(t.find("| category | us/decode step | share | kernels/decode step | exposed us/decode step |"),
            std::string::npos) << t;
  EXPECT_NE(t.find("| attention | 3.0 | 52.2% | 1 | 2.5 |"), std::string::npos) << t;
  EXPECT_NE(t.find("| total | 5.8 | 100.0% | 5 | 2.8 |"), std::string::npos) << t;  // 5680 ns / 2
  EXPECT_NE(t.find("| attention_kernel<4> | attention | 3.0 | 52.2% | 1 | 3.0 | 2.5 | 2.5 |"), std::string::npos) << t;
  const size_t by_exposed = t.find("top 3 kernels by exposed time:");
  ASSERT_NE(by_exposed, std::string::npos) << t;
  const size_t mystery = t.find("| mystery_kernel |", by_exposed);
  ASSERT_NE(mystery, std::string::npos) << t;
  EXPECT_LT(mystery, t.find("| linear_mma_kernel<fp8, 1> |", by_exposed)) << t;
  EXPECT_EQ(t.find("| mystery_kernel |"), mystery) << t;  // not in the first table (4th by GPU time)
  const nlohmann::json j = nlohmann::json::parse(format_report_json(categorize(r), 2, 10));
  EXPECT_TRUE(j["has_exposure"].get<bool>());
  EXPECT_DOUBLE_EQ(j["kernels"][0]["exposed_us_per_step"].get<double>(), 2.5);
}

}  // namespace
}  // namespace tern::cuda
