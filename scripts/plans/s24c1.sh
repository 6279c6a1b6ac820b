#!/usr/bin/env bash
# The next GPU session's first call (written in session 23). Build the pack from the HEAD first: ninja -C build-cuda,
# scripts/gpu-pack build-cuda, cp build-cuda/gpu-pack.tar.xz .plans/packs/s24.tar.xz; carry [".plans", ".whl"].
# PART=a (~330 s): the two op tests session 23 mended without a GPU (bd44d0d: GpuActFp8.E4m3EveryFoldShiftAgainstCpu,
#   GpuBasic.LinearBatchInvariant), then the op tests session 23's whole run did not reach (it stopped at its limit in
#   GpuAttentionPrefill.MatchesCpuAndDecodeKernel/v4flash), then the model tests whole.
# PART=b (~300 s): the first half of tern_gpu_tests again (to its first suites) so that one session has passed the
#   whole list; then the serve-bench of #15 (s22c2.sh) in its own call.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s24.tar.xz}
source scripts/plans/env.sh
pf() { grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" "$1" | head -${2:-12}; }
if [[ ${PART:-a} == a ]]; then
stamp "0. the two mended op tests"
timeout 90 $G/tern_gpu_tests --gtest_filter='GpuActFp8.E4m3EveryFoldShiftAgainstCpu:Shapes/GpuBasic.LinearBatchInvariant/*' \
  > $OUT/mended.log 2>&1; echo "rc $?"; pf $OUT/mended.log
stamp "1. the op tests from GpuAttentionPrefill on (session 23's run stopped there)"
$G/tern_gpu_tests --gtest_list_tests | awk '/^[^ ]/{suite=$1} /^  /{print suite $1}' > $OUT/all.txt
awk '/GpuAttentionPrefill/{on=1} on' $OUT/all.txt | grep -v MoeExpertsExact | paste -sd: > $OUT/rest.txt
timeout 240 $G/tern_gpu_tests --gtest_filter="$(cat $OUT/rest.txt)" > $OUT/rest.log 2>&1; echo "rc $?"; pf $OUT/rest.log 20
grep -c "^\[       OK" $OUT/rest.log
stamp "2. the model tests"
timeout 150 $G/tern_gpu_model_tests > $OUT/model-tests.log 2>&1; echo "rc $?"; pf $OUT/model-tests.log
fi
if [[ ${PART:-a} == b ]]; then
stamp "3. the op tests before GpuAttentionPrefill (session 23 passed them under older binaries)"
awk '/GpuAttentionPrefill/{exit} 1' $OUT/all.txt 2>/dev/null | paste -sd: > $OUT/first.txt || true
$G/tern_gpu_tests --gtest_list_tests | awk '/^[^ ]/{suite=$1} /^  /{print suite $1}' | awk '/GpuAttentionPrefill/{exit} 1' \
  | grep -v MoeExpertsExact | paste -sd: > $OUT/first.txt
timeout 300 $G/tern_gpu_tests --gtest_filter="$(cat $OUT/first.txt)" > $OUT/first.log 2>&1; echo "rc $?"; pf $OUT/first.log 20
grep -c "^\[       OK" $OUT/first.log
fi
stamp done
