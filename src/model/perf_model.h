// The performance model of ../shared/design/performance.md as functions, for `tern bench-step`: the bytes one
// decode step must read (weights streamed once, plus the distinct routed experts the batch touches) and the
// FLOPs of a prefill (2 x active parameters per token, plus sparse attention and the indexer's scoring).
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/synthetic_model.h"

namespace tern::model {

// Distinct experts one layer's batch of B tokens touches under uniform routing: E (1 - (1 - k/E)^B).
double expected_distinct_experts(int64_t experts, int64_t per_token, int64_t batch);

// Bytes a decode step of `batch` sequences reads: every dense weight once (the head included; not the
// embedding or tid2eid, of which a step reads its tokens' rows only) plus distinct experts per layer x
// one expert's bytes. `distinct_per_layer` < 0: expected_distinct_experts. KV-cache reads are not counted.
double decode_step_bytes(const SyntheticSizes& sizes, const ModelConfig& c, int64_t batch,
                         double distinct_per_layer = -1);

// A decode step does not run the MTP layer (decode_step_bytes leaves out its SyntheticSizes::mtp_dense_bytes and
// experts); one MTP draft step of `batch` sequences reads its dense part, the head and its distinct experts. 0
// without an MTP layer.
double mtp_draft_step_bytes(const SyntheticSizes& sizes, const ModelConfig& c, int64_t batch);

// Parameters one token multiplies (per layer: attention, compressor, indexer, router gate, shared expert,
// the k routed experts and mHC's mixes; not the embedding; the head only when `head`). The trunk only: a
// forward does not run the MTP layer (drafting and its prompt catch-up do).
double active_params_per_token(const ModelConfig& c, bool head);

// FLOPs of prefilling `tokens` tokens from position 0 (logits for the last token only): 2 x the active
// parameters per token, plus per token at position p sparse attention over its window and selected
// compressed rows (4 x heads x head_dim per row) and the indexer's scores against every compressed key
// (2 x index heads x index_head_dim per key).
double prefill_flops(const ModelConfig& c, int64_t tokens);

}  // namespace tern::model
