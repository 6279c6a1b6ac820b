// The batched step ops (ops/step.h) on the CPU: the reference of the CUDA step kernels.
//
// The address tables hold host addresses (a CPU tensor's data pointer). Each sequence of the step (its slots
// firsts[i] .. , one token each) runs the eager op (sparse_attention, compressor_update, indexer_topk) on the
// chunk of its tokens, through the same entry points and CPU kernels as the eager forward, so its result is the
// eager op's bits. Sequences run one after another (each eager op is threaded inside). A slot at position -1 is
// inert: it reads and writes no state; its attention output is zeros and its top-k row all -1, as on the GPU.
#include <algorithm>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "ops/attention.h"
#include "ops/compressor.h"
#include "ops/context.h"
#include "ops/indexer.h"
#include "ops/kv_row.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace tern::cpu {
namespace {

// Every view of a step op is contiguous (the tables and rows are indexed by slot). The dispatch sends this backend
// host tensors (or a test's stand-in device whose memory is host memory: tests/model/test_device.cpp).
void require_host(std::string_view op,
                  std::initializer_list<std::pair<const char*, const TensorView*>> views) {
  for (const auto& [name, v] : views)
    TERN_CHECK(v->empty() || v->is_contiguous(), "cpu ", op, ": ", name, " must be contiguous");
}

const int64_t* positions_of(const TensorView& positions) {
  return positions.data_as<const int64_t>();
}

// Slot i's address from a table; an active slot without one is an error.
std::byte* address_at(std::string_view op, std::string_view what, const TensorView& table, int64_t i,
                      int64_t position) {
  const int64_t a = table.data_as<const int64_t>()[i];
  TERN_CHECK(a != 0, "cpu ", op, ": slot ", i, " at position ", position, " has no ", what, " address");
  return reinterpret_cast<std::byte*>(static_cast<uintptr_t>(a));
}

// Slot i's paged rows as the eager ops take them, with a block table covering `count` rows (empty when
// count is 0: no page is read). The pool view spans the pages the table names.
PagedRows slot_rows(std::string_view op, const ops::StepPagedRows& r, int64_t i, int64_t position,
                    int64_t count, Device device) {
  if (count == 0) return {};
  std::byte* pool = address_at(op, "pool", r.pools, i, position);
  auto* table = reinterpret_cast<int32_t*>(address_at(op, "row block table", r.tables, i, position));
  const int64_t pages = (count + r.rows_per_page - 1) / r.rows_per_page;
  int64_t num_pages = 0;
  for (int64_t p = 0; p < pages; ++p) {
    TERN_CHECK(table[p] >= 0, "cpu ", op, ": slot ", i, "'s row block table names page ", table[p]);
    num_pages = std::max<int64_t>(num_pages, table[p] + 1);
  }
  PagedRows rows;
  rows.pool = TensorView(pool, DType::u8, {num_pages, r.page_bytes}, device);
  rows.block_table = TensorView(table, DType::i32, {pages}, device);
  rows.offset_in_page = r.offset_in_page;
  rows.rows_per_page = r.rows_per_page;
  rows.row_bytes = r.row_bytes;
  return rows;
}

// The step's sequences in slot order: slots [first, first + n) at positions pos[first] + 0 .. n - 1. Checks
// that firsts (empty: one slot each) describes such runs.
struct Run {
  int64_t first = 0, n = 1;
};
std::vector<Run> runs_of(std::string_view op, const TensorView& firsts, const int64_t* pos, int64_t slots) {
  std::vector<Run> runs;
  const int64_t* f = firsts.empty() ? nullptr : firsts.data_as<const int64_t>();
  for (int64_t i = 0; i < slots; ++i) {
    const int64_t first = f != nullptr ? f[i] : i;
    if (first == i) {
      runs.push_back({i, 1});
      continue;
    }
    TERN_CHECK(!runs.empty() && first == runs.back().first && pos[first] >= 0 && pos[i] == pos[i - 1] + 1, "cpu ",
               op, ": slot ", i, " names slot ", first, " as its sequence's first: not the run it continues "
               "(a sequence's slots are consecutive, at consecutive positions)");
    ++runs.back().n;
  }
  return runs;
}

}  // namespace

void CpuBackend::step_attention(const ops::StepAttentionArgs& a, const TensorView& out) {
  // The per-sequence ops below run on this backend (this instance), on the device it stands for.
  const ops::Context self = own_context(out.device());
  const char* op = "step_attention";
  require_f32(op, {&a.q, &a.sinks, &out});
  require_host(op, {{"q", &a.q},
                    {"positions", &a.positions},
                    {"rows", &a.rows},
                    {"rings", &a.rings},
                    {"compressed pools", &a.compressed.pools},
                    {"compressed tables", &a.compressed.tables},
                    {"selected", &a.selected},
                    {"sinks", &a.sinks},
                    {"out", &out}});
  const int64_t S = a.q.dim(0), rb = a.format.row_bytes();
  const int64_t* pos = positions_of(a.positions);
  for (const Run& r : runs_of(op, a.firsts, pos, S)) {
    const int64_t i = r.first, last = pos[i] + r.n - 1;
    const TensorView o = out.rows(i, i + r.n);
    if (pos[i] < 0) {  // inert: zeros, no reads
      std::fill_n(o.data_as<float>(), o.numel(), 0.0f);
      continue;
    }
    ops::AttentionArgs e;
    e.q = a.q.rows(i, i + r.n);
    e.start = pos[i];
    e.format = a.format;
    e.chunk_rows = a.rows.rows(i, i + r.n);
    e.ring = TensorView(address_at(op, "ring", a.rings, i, pos[i]), DType::u8, {a.window, rb}, a.q.device());
    e.window = a.window;
    e.ratio = a.ratio;
    if (a.ratio > 0) {
      // The eager forward's count for the chunk, bounded like the GPU launch by max_compressed.
      e.num_compressed = std::min(a.max_compressed, (last + 1) / a.ratio);
      e.compressed = slot_rows(op, a.compressed, i, pos[i], e.num_compressed, a.q.device());
    }
    e.selected = a.selected.empty() ? TensorView() : a.selected.rows(i, i + r.n);
    e.sinks = a.sinks;
    e.scale = a.scale;
    ops::sparse_attention(self, e, o);
  }
  if (!a.inv_freq.empty()) ops::rope(self, out, a.positions, a.inv_freq, /*inverse=*/true);
}

void CpuBackend::step_compressor(const ops::StepCompressorArgs& a) {
  // The per-sequence ops below run on this backend (this instance), on the device it stands for.
  const ops::Context self = own_context(a.kv.device());
  const char* op = "step_compressor";
  require_f32(op, {&a.kv, &a.gate, &a.ape, &a.emitted});
  require_host(op, {{"accs", &a.accs}, {"ape", &a.ape}, {"positions", &a.positions}, {"emitted", &a.emitted}});
  // kv and gate may be column ranges of one stacked product's output (model/stacked.h): strided rows, which the
  // eager op takes as they are.
  const int64_t S = a.positions.dim(0), n_acc = a.overlap ? 2 : 1;
  const int64_t* pos = positions_of(a.positions);
  for (const Run& r : runs_of(op, a.firsts, pos, S)) {
    const int64_t i = r.first;
    if (pos[i] < 0) continue;  // inert
    TERN_CHECK(r.n <= a.max_queries, "cpu ", op, ": a sequence of ", r.n, " tokens, max_queries ", a.max_queries);
    // The chunk's entries (the eager op's, in window order from the first one it closes), then each into the
    // row of the token that closes it.
    const int64_t emit = ops::compressor_emit_count(pos[i], r.n, a.ratio);
    Tensor entries = transient(DType::f32, {std::max<int64_t>(emit, 1), a.width}, a.kv.device());
    ops::CompressorArgs e;
    e.acc = TensorView(address_at(op, "accumulator", a.accs, i, pos[i]), DType::f32, {n_acc, 3, a.width},
                       a.kv.device());
    e.kv = a.kv.rows(i, i + r.n);
    e.gate = a.gate.rows(i, i + r.n);
    e.ape = a.ape;
    e.start_pos = pos[i];
    e.ratio = a.ratio;
    e.overlap = a.overlap;
    e.emitted = entries.view().rows(0, emit);
    ops::compressor_update(self, e);
    const int64_t first_entry = pos[i] / a.ratio;
    for (int64_t k = 0; k < emit; ++k) {
      const int64_t closing = (first_entry + k) * a.ratio + a.ratio - 1;  // its token's position
      std::memcpy(a.emitted.rows(i + closing - pos[i], i + closing - pos[i] + 1).data(),
                  entries.view().rows(k, k + 1).data(), a.width * sizeof(float));
    }
  }
}

// The composition of the batched ops the fused op stands for, so its bits are theirs by construction.
void CpuBackend::step_compress_emit(const ops::StepCompressEmitArgs& a) {
  // The per-sequence ops below run on this backend (this instance), on the device it stands for.
  const ops::Context self = own_context(a.compressor.kv.device());
  const ops::StepCompressorArgs& c = a.compressor;
  require_host("step_compress_emit", {{"positions", &c.positions}});
  const int64_t S = c.positions.dim(0);
  const int64_t* pos = positions_of(c.positions);
  const Device device = c.kv.device();  // the host, or a test's stand-in device of host memory
  Tensor emitted = transient(DType::f32, {S, c.width}, device), entry_positions(DType::i64, {S});
  Tensor rows = transient(DType::u8, {S, a.format.row_bytes()}, device);
  // Each slot's entry position, as model::StepTables::fill writes it for the unfused chain (inert: 0).
  for (int64_t i = 0; i < S; ++i) entry_positions.data<int64_t>()[i] = pos[i] < 0 ? 0 : pos[i] / c.ratio * c.ratio;
  if (device != Device::cpu) {
    Tensor on_device = transient(DType::i64, {S}, device);
    copy_view(entry_positions, on_device);
    entry_positions = std::move(on_device);
  }
  ops::StepCompressorArgs update = c;
  update.emitted = emitted;
  ops::step_compressor(self, update);
  ops::rms_norm(self, emitted, a.norm, a.eps, emitted);
  ops::rope(self, emitted, entry_positions, a.inv_freq);
  ops::kv_pack(self, emitted, a.format, rows);
  ops::store_paged_rows(self, rows, a.dest, c.positions, c.ratio);
}

void CpuBackend::step_indexer_topk(const ops::StepIndexerArgs& a, int topk, const TensorView& indices) {
  // The per-sequence ops below run on this backend (this instance), on the device it stands for.
  const ops::Context self = own_context(indices.device());
  const char* op = "step_indexer_topk";
  require_f32(op, {&a.q, &a.weights});
  require_host(op, {{"q", &a.q},
                    {"weights", &a.weights},
                    {"keys pools", &a.keys.pools},
                    {"keys tables", &a.keys.tables},
                    {"positions", &a.positions},
                    {"indices", &indices}});
  const int64_t S = a.q.dim(0);
  const int64_t* pos = positions_of(a.positions);
  for (int64_t i = 0; i < S; ++i) {
    const TensorView idx = indices.rows(i, i + 1);
    if (pos[i] < 0) {  // inert: no keys
      std::fill_n(idx.data_as<int32_t>(), topk, int32_t{-1});
      continue;
    }
    ops::IndexerArgs e;
    e.q = a.q.rows(i, i + 1);
    e.weights = a.weights.rows(i, i + 1);
    // The eager forward's count for a one-token chunk, bounded like the GPU launch by max_keys.
    e.num_keys = std::min(a.max_keys, (pos[i] + 1) / a.ratio);
    e.keys = slot_rows(op, a.keys, i, pos[i], e.num_keys, a.q.device());
    e.positions = a.positions.rows(i, i + 1);
    e.ratio = a.ratio;
    ops::indexer_topk(self, e, topk, idx);
  }
}

void CpuBackend::store_ring_rows(const TensorView& rows, const TensorView& rings, const TensorView& positions,
                                 const TensorView& firsts, int64_t window) {
  const char* op = "store_ring_rows";
  require_host(op, {{"rows", &rows}, {"rings", &rings}, {"positions", &positions}, {"firsts", &firsts}});
  TERN_CHECK(rows.rank() == 2, "cpu ", op, ": rows ", rows.shape().str(), " must be [slots, row_bytes]");
  const int64_t S = rows.dim(0), rb = rows.dim(1);
  const int64_t* pos = positions_of(positions);
  (void)runs_of(op, firsts, pos, S);  // checks the runs
  const int64_t* f = firsts.empty() ? nullptr : firsts.data_as<const int64_t>();
  for (int64_t i = 0; i < S; ++i) {
    if (pos[i] < 0) continue;  // inert
    if (f != nullptr && i + window < S && f[i + window] == f[i]) continue;  // a later token takes its ring slot
    std::memcpy(address_at(op, "ring", rings, i, pos[i]) + (pos[i] % window) * rb,
                rows.data_as<const std::byte>() + i * rb, rb);
  }
}

void CpuBackend::store_paged_rows(const TensorView& rows, const ops::StepPagedRows& dest,
                                  const TensorView& positions, int ratio) {
  const char* op = "store_paged_rows";
  require_host(
      op, {{"rows", &rows}, {"pools", &dest.pools}, {"tables", &dest.tables}, {"positions", &positions}});
  const int64_t S = rows.dim(0), rb = dest.row_bytes;
  const int64_t* pos = positions_of(positions);
  for (int64_t i = 0; i < S; ++i) {
    if (pos[i] < 0 || (pos[i] + 1) % ratio != 0) continue;  // inert, or the token closes no window
    const int64_t entry = pos[i] / ratio;
    std::memcpy(slot_rows(op, dest, i, pos[i], entry + 1, rows.device()).row(entry),
                rows.data_as<const std::byte>() + i * rb, rb);
  }
}

}  // namespace tern::cpu
