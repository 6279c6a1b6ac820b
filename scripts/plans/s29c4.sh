#!/usr/bin/env bash
# Session 29, call 4 (pack s29c = the merge of helper-46's s29-eager-tables: eager steps planned by the model, their
# step tables built by the caller (engine::eager_step, DecodeGraphs), the forward only reading them; carry
# [".plans"]). The GPU tests helper-46 named: the model's eager forward on the tables and mixed steps, graphs equal
# to eager (decode, verify, draft rounds), the speculator's trunk step, drafting and rollback.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s29c.tar.xz
source scripts/plans/env.sh
L=$OUT
stamp "model tests"
timeout 400 $G/tern_gpu_model_tests --gtest_filter='GpuModel_.*:GpuGraphs_.*:GpuSpeculative.*:-GpuGraphs_.*Speed*' \
  > $L/model.log 2>&1; echo "rc $?"; pf $L/model.log 12; grep -c "^\[       OK" $L/model.log
stamp done
