# Sourced by the device plans (scripts/plans/s*.sh) on the GPU machine: unpacks the pack the plan names in
# $TERN_PACK (default .plans/packs/s19.tar.xz: binaries built here by scripts/gpu-pack, carried with [".plans",
# ".whl"]), the carried libraries, fixtures and the commit, as scripts/gpu-check does. Plans live in the repository
# so that what a results.md entry ran survives the session (session 18 lost its plans with its machine).
BUILD=build-cuda
mkdir -p $BUILD
# unpack PACK DIR: a pack's binaries into DIR (a second pack beside $BUILD: the base of an A/B between binaries).
unpack() { mkdir -p "$2" && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$1" "$2"; }
unpack "${TERN_PACK:-.plans/packs/s19.tar.xz}" $BUILD
export TERN_FIXTURES=$PWD/tests/fixtures
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
sys_stdcxx=$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 /{print $NF; exit}')
need_stdcxx=0
if [[ -z "$sys_stdcxx" ]] || ! grep -qa GLIBCXX_3.4.30 "$sys_stdcxx"; then need_stdcxx=1; fi
carried_libs=$(mktemp -d)
for f in "$PWD/$BUILD/tests/gpu"/lib/*; do
  if [[ $(basename "$f") == libstdc++* && $need_stdcxx -eq 0 ]]; then continue; fi
  ln -s "$f" "$carried_libs/"
done
export LD_LIBRARY_PATH=$carried_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if ! ldconfig -p 2>/dev/null | grep -q 'libcublasLt.so.13 '; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s) for p in nvidia.__path__ for s in ("cublas/lib", "cu13/lib")))' 2>/dev/null); do
    if [[ -e $d/libcublasLt.so.13 ]]; then export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d; break; fi
  done
fi
export TERN_COMMIT=$(cat $BUILD/commit.txt)
G=$BUILD/tests/gpu; T=$BUILD/tools/tern
T0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - T0 )) s] $*"; }
echo "== card: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)  commit $TERN_COMMIT"
# pf LOG [N]: the test verdicts and failures of a gtest log (N lines, 12 by default).
pf() { grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|differ|error" "$1" | head -${2:-12}; }
# ab_bench ROUNDS BATCHES: bench-step of build-base and $BUILD alternating, ROUNDS rounds, at BATCHES (context 1K,
# prefill 1K), logs in $L/bs-ROUND-{base,cuda}.log, the decode rows printed (the loop every A/B plan ran by hand).
ab_bench() {
  local r b
  for r in $(seq 1 "$1"); do
    for b in base cuda; do
      timeout 100 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches "$2" \
        --steps 12 --warmup 3 > $L/bs-$r-$b.log 2>&1; echo "rc $? ($r $b)"
      grep -hE "^decode |error" $L/bs-$r-$b.log | cut -c1-110
    done
  done
}
# ab_prefill ROUNDS SIZE...: the warm prefill of build-base and $BUILD alternating, ROUNDS rounds, at each SIZE
# (context 1K), logs in ${P:-$L}/pf-ROUND-{base,cuda}-SIZE.log, the prefill rows printed (the loop sessions 30-31
# wrote out by hand in each plan).
ab_prefill() {
  local rounds=$1 r b p
  shift
  for r in $(seq 1 "$rounds"); do
    for b in base cuda; do
      for p in "$@"; do
        timeout 100 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill "$p" \
          --batches 1 --steps 2 --warmup 1 > "${P:-$L}/pf-$r-$b-$p.log" 2>&1; echo "rc $? ($p $r $b)"
        grep -hE "^prefill \||error" "${P:-$L}/pf-$r-$b-$p.log" | cut -c1-100
      done
    done
  done
}
# envab VAR "VALUES" ROUNDS SIZE...: the warm prefill with VAR at each value, rounds alternating (one binary:
# $T; logs in ${P:-$L}).
envab() {
  local var=$1 vals=$2 rounds=$3 r v p
  shift 3
  for r in $(seq 1 "$rounds"); do
    for v in $vals; do
      for p in "$@"; do
        env "$var=$v" timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill "$p" \
          --batches 1 --steps 2 --warmup 1 > "${P:-$L}/$var-$r-$v-$p.log" 2>&1; echo "rc $? ($p $r $var=$v)"
        grep -hE "^prefill \||error" "${P:-$L}/$var-$r-$v-$p.log" | cut -c1-100
      done
    done
  done
}
# pf_rows NAME SIZE REGEX [VAR=VALUE...]: one profiled warm prefill of SIZE tokens (context 1K) with the variables set,
# log ${P:-$L}/pf-SIZE-NAME.log; prints the prefill row and the profile rows whose kernel matches REGEX (session 35's
# plans wrote this loop out each).
pf_rows() {
  local name=$1 p=$2 rx=$3
  shift 3
  env "$@" timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill "$p" --batches 1 --steps 2 \
    --warmup 1 --profile --profile-top 80 > "${P:-$L}/pf-$p-$name.log" 2>&1; echo "rc $? ($p $name $*)"
  grep -hE "^prefill \||error" "${P:-$L}/pf-$p-$name.log" | head -1 | cut -c1-100
  grep -hE "^\| ($rx)" "${P:-$L}/pf-$p-$name.log" | sort -u | cut -c1-130
}
# trace_b1 NAME: bench-step's batch-1 decode timeline (TERN_PROFILE_TRACE, side stream on) to $OUT/NAME.tsv.gz, for
# scripts/trace-joins and reading by hand; the profile's tables in $L/NAME.log.
trace_b1() {
  TERN_PROFILE_TRACE=$OUT/$1.tsv timeout 80 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 \
    --batches 1 --steps 4 --warmup 3 --profile --profile-batches 1 --profile-top 12 > $L/$1.log 2>&1; echo "rc $? (trace)"
  gzip $OUT/$1.tsv
}
# ncu_prefill NAME REGEX [VAR=VALUE...]: ncu of the first kernel matching REGEX (demangled names) in an 8K prefill with
# the variables set (SpeedOfLight, warp states, scheduler, compute, source counters, memory); $L/details-NAME.txt and
# $L/sass-NAME.csv, and its duration / issue lines printed (sessions 35-36 wrote this block out in each plan).
ncu_prefill() {
  local name=$1 rx=$2
  shift 2
  env "$@" timeout 150 ncu --clock-control none --kernel-name regex:"$rx" --launch-count 1 --section SpeedOfLight \
    --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section SourceCounters \
    --section MemoryWorkloadAnalysis --import-source no -o "${P:-$L}/ncu-$name" $T bench-step --device cuda \
    --config full --contexts 1024 --prefill 8192 --batches 1 --steps 1 --warmup 0 > "${P:-$L}/ncu-$name.log" 2>&1
  echo "rc $? (ncu $name $*)"
  timeout 60 ncu -i "${P:-$L}/ncu-$name.ncu-rep" --page details > $L/details-$name.txt 2>&1
  timeout 60 ncu -i "${P:-$L}/ncu-$name.ncu-rep" --page source --csv --print-source sass > $L/sass-$name.csv 2>/dev/null
  grep -E "$rx|Duration|Issued Warp|No Eligible|L2 Cache Throughput" $L/details-$name.txt | head -5 | cut -c1-120
}
