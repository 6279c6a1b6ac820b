// The reference fixtures (tests/fixtures/<name>/): the checkpoint, loaded once per process, and the
// reference outputs of reference.safetensors.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/safetensors.h"
#include "model/v4_model.h"

namespace tern::test {

class Fixture {
 public:
  static const Fixture& get(const std::string& name);  // "tiny-mxfp4", "tiny-nvfp4"
  static std::vector<std::string> names();

  const std::string& name() const { return name_; }
  const model::ModelWeights& weights() const { return weights_; }
  // Prompt sets: "prompt" (the main set: f32 parity) and "bf16.prompt" (prompts whose reference run keeps
  // every router / indexer decision and greedy token under bf16 activations: the GPU's bounds apply there).
  // Tensors of prompt p of set s are "<s>.<p>.ids", ".logits", ".greedy", ".greedy_logits".
  int num_prompts(const std::string& set = "prompt") const;
  std::vector<int64_t> ids(int prompt, const std::string& set = "prompt") const;
  std::vector<int64_t> greedy(int prompt, const std::string& set = "prompt") const;
  // f32 [T, vocab] (or [steps, vocab]); empty view when absent
  TensorView tensor(const std::string& key) const;
  // The MTP layer's reference (mtp_reference.safetensors: "mtp.prompt.<p>.logits", ".chain_tokens",
  // ".chain_logits", ".out_streams"); empty view when absent.
  TensorView mtp_tensor(const std::string& key) const;
  // Logits with the official reference's activation quantisation (act_fp8_reference.safetensors, written by
  // tools/reference/check_semantics.py --act-fp8-out: "prompt.<p>.logits"); empty view when absent.
  TensorView act_fp8_tensor(const std::string& key) const;
  std::string dir() const { return dir_; }

 private:
  std::string name_;
  model::ModelWeights weights_;
  std::shared_ptr<model::SafetensorsFile> ref_, mtp_ref_, act_fp8_ref_;
  std::string dir_;
};

// The prompts the expensive (token-by-token) tests run. Under ASan/UBSan, where those tests check memory
// safety rather than numerics (the normal build runs them on every prompt), a subset: every third prompt
// and the longest one.
std::vector<int> prompts_to_run(const Fixture& f);
bool sanitized_build();

// max |a - b| over n values, and max |b|.
struct Diff {
  float max_abs = 0, ref_max = 0;
  float rel() const { return ref_max > 0 ? max_abs / ref_max : max_abs; }
};
Diff diff(const float* got, const float* want, int64_t n);

}  // namespace tern::test
