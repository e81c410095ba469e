#!/bin/bash
# One GPU check of dmlrepro on one CUDA node, from the repository root, in at most BUDGET seconds (default 570):
# the stack probe, the CUDA lane (pytest -m cuda), the engine's tests with run configs on `device: auto`, and the
# GPU benchmarks (data pipeline at 16 and 8 CPUs, PFML vs Proxy-Anchor epoch, retrieval at SOP size, preflight of
# representative paper experiments, nvJPEG decoding against the CPU path). Writes gpu_check.json and gpu_check.md (plus every log in logs.tgz) to $OUT
# (default ./gpu-check-out), refreshed after every step so that a cut run still returns what it did.
# CHECK=tiny: a CPU dry run of the script itself (tiny sizes, the CUDA lane on the CPU). docs/benchmarks.md#the-gpu-check
set -u
CHECK=${CHECK:-full}
RET=${OUT:-$(pwd)/gpu-check-out}; mkdir -p "$RET"
WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)
PY=${PY:-python3}
T0=$SECONDS
export PYTHONUNBUFFERED=1 PYTHONPATH=$(pwd)/src${PYTHONPATH:+:$PYTHONPATH}
left() { echo $(( ${BUDGET:-570} - (SECONDS - T0) )); }
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; [ "$want" -lt 5 ] && want=5; echo "$want"; }
step() {  # step NAME SECONDS COMMAND...: run, time, record the exit code; then refresh the summary
  local name=$1 limit; limit=$(cap "$2"); shift 2
  local t=$SECONDS
  timeout "$limit" "$@" >"$WORK/$name.log" 2>&1
  echo "{\"step\": \"$name\", \"exit\": $?, \"seconds\": $((SECONDS - t)), \"limit\": $limit}" >>"$WORK/steps.jsonl"
  $PY benchmarks/gpu_check_summary.py "$WORK" "$RET" >/dev/null 2>&1
  tar czf "$RET/logs.tgz" -C "$WORK" . 2>/dev/null
}

if [ "$CHECK" = full ]; then
  DEV=cuda; IMG=224; BB=resnet50; BS=100; N=8054; STEPS=60; RN=60502; RD=512; NW=12
  TESTS="tests/train tests/evaluation tests/asap"; EXP="pfml_table1 pfml_supp_table2_64d rsw_table1 asap_table1"
  LANE_ENV=()
else
  DEV=cpu; IMG=32; BB=tiny_cnn; BS=16; N=400; STEPS=3; RN=3000; RD=64; NW=0
  TESTS="tests/train/test_precision.py"; EXP="rsw_table1"
  LANE_ENV=(env DMLREPRO_CUDA_LANE_DEVICE=cpu)
fi
CPUS=$(nproc); HALF=$(( CPUS < 8 ? CPUS : 8 )); DATA=$WORK/cars_like
XDIST=(); [ "$NW" -gt 0 ] && XDIST=(-n "$NW")

step probe 30 $PY benchmarks/gpu_check_probe.py "$WORK/probe.json"
step cuda_lane 110 "${LANE_ENV[@]}" env DMLREPRO_LANE_RECORD="$WORK/lane" $PY -m pytest -m cuda -p no:cacheprovider \
  -q "${XDIST[@]}" --junitxml="$WORK/cuda_lane.xml" tests
step suite_device_auto 110 $PY -m pytest -p no:cacheprovider -q "${XDIST[@]}" --timeout 110 -m "not cuda" \
  --junitxml="$WORK/suite_device_auto.xml" $TESTS
step pipeline_all 60 $PY benchmarks/bench_training.py --device $DEV --backbone $BB --image-size $IMG --batch-size $BS \
  --workers auto --steps $STEPS --warmup-steps 10 --cases pipeline --images $N --data-root "$DATA" --out "$WORK/pipeline_all.json"
step pipeline_8cpu 45 taskset -c 0-$((HALF - 1)) $PY benchmarks/bench_training.py --device $DEV --backbone $BB \
  --image-size $IMG --batch-size $BS --workers auto --steps $((STEPS / 2)) --warmup-steps 5 --cases pipeline --images $N \
  --data-root "$DATA" --out "$WORK/pipeline_8cpu.json"
step epoch 60 $PY benchmarks/bench_training.py --device $DEV --backbone $BB --image-size $IMG --batch-size $BS \
  --workers auto --images $N --m-values 5 20 30 --cases epoch --data-root "$DATA" --out "$WORK/epoch.json"
step retrieval 40 $PY benchmarks/bench_retrieval.py --n $RN --dim $RD --device $DEV --backends faiss-cpu,torch --repeats 2
step device_pipeline 30 $PY benchmarks/bench_device_pipeline.py --device $DEV --images 200 --repeats 2 \
  --json "$WORK/device_pipeline.json"
step preflight 80 $PY -m dmlrepro.cli preflight --configfile config/paper.yaml --device $DEV --experiments $EXP \
  --workers 4 --shape-timeout 100 --json "$WORK/preflight.json" --table "$WORK/preflight.txt"
$PY benchmarks/gpu_check_summary.py "$WORK" "$RET"
tar czf "$RET/logs.tgz" -C "$WORK" .
echo "gpu check: $RET/gpu_check.md, $RET/gpu_check.json ($((SECONDS - T0)) s)"
