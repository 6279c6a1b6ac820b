// Batched step ops: every slot of the batch brings one token, and one launch serves all slots. A sequence brings
// q >= 1 tokens in consecutive slots at consecutive positions (a decode token, or k + 1 tokens to verify): slot i
// belongs to the sequence whose first slot is firsts[i] (an i64 [slots] array; empty: every slot is its own
// sequence, q = 1). What differs per slot (the token's position, its sequence, where its state lives) is read on
// the device from per-step arrays, so a step can be recorded once (a CUDA graph) and replayed with new arrays.
// A slot at position -1 is inert padding (its own sequence): it reads no state, writes none, raises no error.
//
// Address tables are i64 [slots] tensors holding device addresses (0 for inert slots): each slot's ring or
// accumulators. Compressed rows and indexer keys are paged (StepPagedRows): per slot the address of its
// sequence's pool and row block table, and one page geometry for all slots.
// Each op computes per sequence exactly what its eager counterpart computes for the chunk of that sequence's
// tokens (same kernels, same reduction orders), so a step gives the eager forward's bits.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/kv_row.h"

namespace tern::ops {

class Context;  // ops/context.h: each op runs in one

// Each slot's paged rows (compressed rows or indexer keys; core/paged_rows.h): row r of slot i is at
// offset_in_page + (r % rows_per_page) * row_bytes of page tables[i][r / rows_per_page] of the pool at
// pools[i] (pages of page_bytes).
struct StepPagedRows {
  TensorView pools, tables;  // i64 [slots]: addresses (u8 pool, i32 row block table on the device)
  int64_t page_bytes = 0, offset_in_page = 0, rows_per_page = 0, row_bytes = 0;
};

// Slot i's query at positions[i] sees the window positions >= its sequence's first position
// (positions[firsts[i]]) in this step's rows (row firsts[i] + position - first position), the older ones in its
// ring; so the step's rows enter the rings after the attention (store_ring_rows).
struct StepAttentionArgs {
  TensorView q;          // f32 [slots, heads, head_dim]
  TensorView positions;  // i64 [slots]
  KvRowFormat format;
  TensorView rows;        // u8 [slots, row_bytes]: the step's new rows (not yet in the rings)
  TensorView rings;       // i64 [slots]: ring addresses (u8 [window, row_bytes] each)
  StepPagedRows compressed;  // each slot's compressed rows (ratio > 0)
  int64_t window = 0;
  int ratio = 0;
  int64_t max_compressed = 0;  // bound on any slot's compressed rows (sizes the launch)
  TensorView selected;         // i32 [slots, k] (CSA) or empty
  TensorView sinks;            // f32 [heads]
  float scale = 1.0f;
  TensorView firsts;  // i64 [slots] or empty (one token a sequence)
  // f32 [rope_dim / 2] or empty: out's last rope_dim dims of each head rotated back at the slot's position, as
  // ops::rope(out, positions, inv_freq, true) after the op would (the same bits; the GPU's decode kernel does it in
  // its merge: one launch less a layer).
  TensorView inv_freq;
};
void step_attention(const Context& ctx, const StepAttentionArgs& a, const TensorView& out);

// A sequence's tokens fold into its accumulators in slot order (one chunk); the entry a token closes goes to that
// token's slot.
struct StepCompressorArgs {
  TensorView accs;       // i64 [slots]: accumulator addresses (f32 [overlap ? 2 : 1, 3, width] each)
  TensorView kv, gate;   // f32 [slots, channels], rows equally spaced (as CompressorArgs' kv and gate)
  TensorView ape;        // f32 [ratio, channels]
  TensorView positions;  // i64 [slots]
  int ratio = 0;
  bool overlap = false;
  int64_t width = 0;
  TensorView emitted;  // f32 [slots, width]: row i written only when slot i's token closes a window
  TensorView firsts;   // i64 [slots] or empty (one token a sequence)
  int64_t max_queries = 1;  // bound on any sequence's tokens in the step (the CUDA kernel's windows per chunk)
};
void step_compressor(const Context& ctx, const StepCompressorArgs& a);

// A compressor's whole emit chain in one op: step_compressor, then for each slot whose token closes a window
// the entry RMS-normed (norm, eps), RoPE'd at its position (position / ratio) * ratio (inv_freq), packed to
// `format` and stored into the slot's paged rows as entry position / ratio -- the bits of step_compressor,
// rms_norm, rope, kv_pack and store_paged_rows in turn (one launch on the GPU instead of five). Slots whose
// token closes no window only update their accumulators; inert slots touch nothing.
struct StepCompressEmitArgs {
  StepCompressorArgs compressor;  // its `emitted` is not used (leave it empty)
  TensorView norm;                  // bf16 | f32 [width]
  float eps = 0.0f;
  TensorView inv_freq;  // f32 [format.rope_dim / 2]
  KvRowFormat format;   // head_dim == width
  StepPagedRows dest;
};
void step_compress_emit(const Context& ctx, const StepCompressEmitArgs& a);
// Whether `device`'s backend has the one-op chain for entries of `width` dims (the CUDA kernel: 128, 256, 512);
// otherwise the caller runs the five ops it stands for (the same bits).
bool step_compress_emit_supported(const Context& ctx, Device device, int64_t width);

struct StepIndexerArgs {
  TensorView q;          // f32 [slots, index_heads, dim]
  TensorView weights;    // f32 [slots, index_heads]
  StepPagedRows keys;  // each slot's indexer keys (rows of dim f32)
  TensorView positions;  // i64 [slots]
  int ratio = 4;
  int64_t max_keys = 0;  // bound on any slot's keys (sizes the launch)
};
// indices i32 [slots, topk]: as indexer_topk for each slot's one query (-1 padded).
void step_indexer_topk(const Context& ctx, const StepIndexerArgs& a, int topk, const TensorView& indices);

// Stores row i of `rows` (u8 [slots, row_bytes]) into slot i's window ring (at rings[i], ring slot
// position % window), unless a later token of its sequence takes that ring slot in the same step (slot i + window
// has the same first slot): only a sequence's last `window` rows land. firsts: as above (empty: one token each).
void store_ring_rows(const Context& ctx, const TensorView& rows, const TensorView& rings,
                     const TensorView& positions, const TensorView& firsts, int64_t window);
// Stores row i of `rows` into slot i's paged rows as entry position / ratio, when the token closes a window.
void store_paged_rows(const Context& ctx, const TensorView& rows, const StepPagedRows& dest,
                      const TensorView& positions, int ratio);

}  // namespace tern::ops
