#!/bin/bash
# One GPU check of dmlrepro on one CUDA node set up by ./setup.sh, from the repository root, in at most BUDGET seconds
# (default 570): the stack probe, the CUDA lane (pytest -m cuda), the engine's device and precision tests, and the GPU
# benchmarks (data pipeline on all allowed CPUs and on 8 of them, PFML vs Proxy-Anchor epoch, retrieval at SOP size,
# nvJPEG decoding against the CPU path, the faithful miniature's preflight (its projection on this node), the preflight
# of representative paper experiments, one step per experiment).
# Writes gpu_check.json and gpu_check.md (plus every step's log in logs.tgz) to $OUT (default ./gpu-check-out),
# refreshed after every step so that a cut run still returns what it did. Exit status 1 when CUDA is absent or a lane
# test failed or was skipped; 2 when the venv's Python is missing. Generated images go to $DATA_DIR (default: a
# temporary folder, removed at the end), never into the logs.
# CHECK=tiny: a CPU dry run of the script's plumbing (tiny sizes, two lane tests on the CPU; tests/benchmarks).
# docs/benchmarks.md#the-gpu-check
set -u
CHECK=${CHECK:-full}
ROOT=$(pwd)
PY=${PY:-$ROOT/.venv/bin/python}
if ! "$PY" -c "import torch, dmlrepro" 2>/dev/null; then
  echo "gpu check: $PY cannot import torch and dmlrepro: run ./setup.sh first (or set PY to the venv's python)" >&2
  exit 2
fi
RET=${OUT:-$ROOT/gpu-check-out}; mkdir -p "$RET"
WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)  # the logs: tarred into $RET/logs.tgz
if [ -z "${DATA_DIR:-}" ]; then DATA_DIR=$(mktemp -d /tmp/gpu-check-data.XXXXXX); trap 'rm -rf "$DATA_DIR"' EXIT; fi
T0=$SECONDS
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
left() { echo $(( ${BUDGET:-570} - (SECONDS - T0) )); }
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; [ "$want" -lt 5 ] && want=5; echo "$want"; }
summary() { "$PY" benchmarks/gpu_check_summary.py "$WORK" "$RET" --check "$CHECK"; }
step() {  # step NAME SECONDS COMMAND...: run, time, record the exit code; then refresh the summary and the logs
  local name=$1 limit; limit=$(cap "$2"); shift 2
  local t=$SECONDS
  timeout "$limit" "$@" >"$WORK/$name.log" 2>&1
  echo "{\"step\": \"$name\", \"exit\": $?, \"seconds\": $((SECONDS - t)), \"limit\": $limit}" >>"$WORK/steps.jsonl"
  summary >/dev/null 2>&1
  tar czf "$RET/logs.tgz" -C "$WORK" . 2>/dev/null
}
finish() {  # the summary's verdict is the exit status
  local rc; summary; rc=$?
  tar czf "$RET/logs.tgz" -C "$WORK" .
  echo "gpu check: $RET/gpu_check.md ($((SECONDS - T0)) s)"; exit $rc
}

if [ "$CHECK" = full ]; then
  DEV=cuda; IMG=224; BB=resnet50; BS=100; N=8054; STEPS=60; WARM=10; MS="5 20 30"; RN=60502; RD=512; JPEGS=200; NW=12
  LANE=(-m cuda tests); TESTS="tests/train/test_precision.py tests/train/test_device_request.py tests/evaluation"
  CONFIG=config/paper.yaml; EXP="pfml_table1 pfml_supp_table2_64d rsw_table1 asap_table1"; LANE_ENV=(); PF_DATA=(); PF_S=45
  MINI=()  # every active experiment of config/miniature.yaml: 23 shapes
else  # the plumbing only: a lane test on the CPU, tiny sizes, the embedded config's one-shape experiment
  DEV=cpu; IMG=32; BB=tiny_cnn; BS=16; N=200; STEPS=3; WARM=1; MS="5"; RN=2000; RD=32; JPEGS=20; NW=0
  LANE=(-m cuda tests/train/test_cuda_lane.py -k "knn_on_the_device or tf32_never")
  TESTS="tests/evaluation/test_search_tf32.py"; CONFIG=config/config.yaml; EXP="rsw_table2"
  LANE_ENV=(env DMLREPRO_CUDA_LANE_DEVICE=cpu); PF_DATA=(--data-root "$DATA_DIR/preflight"); PF_S=120
  MINI=(--experiments rsw_table1)
fi
# the CPUs this job may use (an allocation's need not start at 0), and the first 8 of them
ALLOWED=$("$PY" -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0)))))')
EIGHT=$(echo "$ALLOWED" | tr , '\n' | head -n 8 | paste -sd, -)
XDIST=(); [ "$NW" -gt 0 ] && XDIST=(-n "$NW")

step probe 30 "$PY" benchmarks/gpu_check_probe.py "$WORK/probe.json"
if [ "$CHECK" = full ] && ! grep -q '"cuda_available": true' "$WORK/probe.json" 2>/dev/null; then finish; fi
step cuda_lane 120 "${LANE_ENV[@]}" env DMLREPRO_LANE_RECORD="$WORK/lane" "$PY" -m pytest -p no:cacheprovider -q \
  "${XDIST[@]}" --junitxml="$WORK/cuda_lane.xml" "${LANE[@]}"
step suite_device_auto 90 "$PY" -m pytest -p no:cacheprovider -q "${XDIST[@]}" -m "not cuda" \
  --junitxml="$WORK/suite_device_auto.xml" $TESTS
step pipeline_all 60 "$PY" benchmarks/bench_training.py --device $DEV --backbone $BB --image-size $IMG --batch-size $BS \
  --workers auto --steps $STEPS --warmup-steps $WARM --cases pipeline --images $N --data-root "$DATA_DIR/cars_like" \
  --out "$WORK/pipeline_all.json"
step pipeline_8cpu 40 taskset -c "$EIGHT" "$PY" benchmarks/bench_training.py --device $DEV --backbone $BB \
  --image-size $IMG --batch-size $BS --workers auto --steps $((STEPS / 2 + 1)) --warmup-steps $WARM --cases pipeline \
  --images $N --data-root "$DATA_DIR/cars_like" --out "$WORK/pipeline_8cpu.json"
step epoch 60 "$PY" benchmarks/bench_training.py --device $DEV --backbone $BB --image-size $IMG --batch-size $BS \
  --workers auto --images $N --m-values $MS --cases epoch --data-root "$DATA_DIR/cars_like" --out "$WORK/epoch.json"
step retrieval 25 "$PY" benchmarks/bench_retrieval.py --n $RN --dim $RD --device $DEV --backends torch --repeats 2
step device_pipeline 25 "$PY" benchmarks/bench_device_pipeline.py --device $DEV --images $JPEGS --repeats 2 \
  --json "$WORK/device_pipeline.json"
# its data is not here (MNIST is not on a GPU node): stand-ins with the protocol's counts (docs/preflight.md)
step miniature_preflight 90 "$PY" -m dmlrepro.cli preflight --configfile config/miniature.yaml --device $DEV \
  "${MINI[@]}" --workers 4 --shape-timeout 40 --data-root "$DATA_DIR/miniature" \
  --json "$WORK/miniature_preflight.json" --table "$WORK/miniature_preflight.txt"
for exp in $EXP; do  # one experiment per step: each writes its own JSON, so a cut run keeps the ones done
  step "preflight_$exp" $PF_S "$PY" -m dmlrepro.cli preflight --configfile $CONFIG --device $DEV \
    --experiments "$exp" --workers 4 --shape-timeout 40 "${PF_DATA[@]}" \
    --json "$WORK/preflight_$exp.json" --table "$WORK/preflight_$exp.txt"
done
finish
