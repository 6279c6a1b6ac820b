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
  };
  int64_t tokens = 0;    // N: all new tokens of the batch
  TensorView ids;        // i64 [N]
  TensorView positions;  // i64 [N]
  Tensor ids_storage, positions_storage;  // what ids / positions view in an eager batch
  std::vector<Seq> seqs;
  // A step on the step tables: N slots of one token each (a sequence's q <= max_queries tokens in consecutive
  // slots), per-slot positions, sequences and state addresses in these tables; every sequence's state has
  // `layout`'s page geometry and at most max_tokens positions. seqs is empty in a recorded step (decode_body).
  const DecodeTables* decode = nullptr;
  const cache::StateLayout* layout = nullptr;
  int64_t max_queries = 1, max_tokens = 0;
  StepRecord* record = nullptr;  // when set (a step on the tables): what rollback_step needs is kept here
  std::vector<int64_t> wanted;  // batch rows whose logits are returned

  TensorView rows(const TensorView& t, const Seq& s) const { return t.rows(s.begin, s.begin + s.n); }
};

}  // namespace tern::model
