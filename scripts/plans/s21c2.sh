#!/usr/bin/env bash
# Next session's second call (written in session 20): every GPU op test (the v4flash ones take minutes: CPU
# references), then long contexts (#14 item 7: 64K / 128K at batch 1 / 16, prefilled in 8K chunks), then the 8K
# prefill profile (#15: what bounds it after wo_a's groups).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s21.tar.xz}
source scripts/plans/env.sh
stamp "PD TTFT against a full-depth 8K prefill (#15; needs .whl: pip download --no-deps -d .whl pytest pluggy iniconfig packaging pygments exceptiongroup; not tomli: its cp311 wheel stops pip on the GPU machine's Python 3.12)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
TERN_BIN=$PWD/$T TERN_DEVICE=cuda TERN_PD_BACKEND=cuda-ipc PYTHONUNBUFFERED=1 timeout 200 \
  python3 -m pytest -q -s -p no:cacheprovider tests/router/test_pd_ttft.py > $OUT/pd-ttft.log 2>&1; echo "rc $?"
grep -E "^\[gpu pd\]|passed|failed|Error" $OUT/pd-ttft.log | head -8
stamp "long contexts"
timeout 150 $T bench-step --device cuda --config full --batches 1,16 --contexts 65536,131072 --prefill 65536 \
  --prefill-chunk 8192 --steps 5 --warmup 2 > $OUT/bs-long.log 2>&1; echo "rc $?"
grep -E "state per|^(decode|prefill) |refused|needed" $OUT/bs-long.log | head -12
stamp "8K prefill profile"
timeout 100 $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 8192 --profile \
  --profile-batches 1 --profile-top 30 --steps 3 --warmup 1 > $OUT/prefill-profile.log 2>&1; echo "rc $?"
grep -A45 "profile of the prefill of 8192" $OUT/prefill-profile.log | head -50
stamp "op tests (all)"
timeout ${OPS_S:-330} $G/tern_gpu_tests > $OUT/op-tests.log 2>&1; echo "rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/op-tests.log | head -20; grep -E "^\[ RUN" $OUT/op-tests.log | tail -1
stamp done
