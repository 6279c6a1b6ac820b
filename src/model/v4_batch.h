// The token layout of one forward() call (internal to the V4 forward).
#pragma once

#include <vector>

#include "model/v4_model.h"

namespace tern::model {

struct Model::Batch {
  struct Seq {
    cache::SequenceState* state = nullptr;
    int64_t begin = 0;  // first row of this sequence's tokens in the batch
    int64_t n = 0;      // its new tokens
    int64_t start = 0;  // position of its first new token
    LogitsFor logits = LogitsFor::last;
    bool on_tables = false;  // its tokens run on the step tables (rows [0, table_tokens))
  };
  int64_t tokens = 0;    // N: all new tokens of the batch
  TensorView ids;        // i64 [N]
  TensorView positions;  // i64 [N]
  Tensor ids_storage, positions_storage;  // what ids / positions view in an eager batch
  std::vector<Seq> seqs;
  // The rows on the step tables: slots 0 .. table_tokens - 1 of these tables, one token each (a sequence's q <=
  // tables->max_queries() tokens in consecutive slots), with per-slot positions, sequences and state addresses;
  // every such sequence's state has the tables' page geometry and at most their layout's max_tokens positions. Rows
  // past table_tokens belong to sequences the tables cannot take (prefill chunks): they run per sequence in the
  // same step (a mixed step). A step wholly on the tables has table_tokens == tokens and its ids / positions are the
  // tables'. seqs is empty in a recorded step (decode_body).
  const StepTables* tables = nullptr;
  int64_t table_tokens = 0;  // 0 without tables
  StepRecord* record = nullptr;  // when set (a step on the tables): what rollback_step needs is kept here
  std::vector<int64_t> wanted;  // batch rows whose logits are returned

  TensorView rows(const TensorView& t, const Seq& s) const { return t.rows(s.begin, s.begin + s.n); }
  // The same of a tensor holding only the step's rows from `first` on (the chunk path's, first = table_tokens).
  TensorView rows(const TensorView& t, const Seq& s, int64_t first) const {
    return t.rows(s.begin - first, s.begin - first + s.n);
  }
};

}  // namespace tern::model
