#!/usr/bin/env bash
# There (the GPU machine, through the device tool), after the pieces of
# pack_onnxruntime_gpu.sh were copied to /tmp/gw, one call per piece:
#   run(carry=[".gpuwhl/dpart.aa"], command="mkdir -p /tmp/gw && cp .gpuwhl/dpart.aa/* /tmp/gw/")
#   ... dpart.ab, dpart.ac, then with the last piece:
#   run(carry=[".gpuwhl/dpart.ad", "shared"], command="cp .gpuwhl/dpart.ad/* /tmp/gw/ && bash bench/gpu/checks.sh gpu-tests")
# (back to back: the machine is given back 30 s after a call). `shared/` is a copy of
# ../shared/clients inside the checkout (ignored), for OneFlow-Benchmark's models.
# Installs onnxruntime-gpu ahead of the image's CPU build once, proves that a session runs
# on the CUDA EP, then runs STAGE; each stage fits one 600 s call and tees its logs to $OUT.
#   gpu-tests  the GPU-only tests, then bench_gpu.py's LeNet / ResNet50 / ResNet50-AMP rows
#   suite      the whole suite on CUDA (pytest-xdist; -v so a cut run still names failures)
#   profile    where the AMP and fp32 ResNet50 steps spend their time and which nodes
#              onnxruntime put on the CPU (profile_step.py), weight-gradient formulations
#   serving    bench_serving.py on CUDA, two data-parallel ranks sharing the GPU
#   stages     the synchronized-batch-norm step's stage schedules on CUDA (bench_stages.py)
#   bert       bench_gpu.py's BERT AMP row and the peak-memory rows (ResNet50 AMP and fp32, BERT)
#   memory     the AMP peak-memory rows as shipped, without CUDA graphs (BERT's row has them:
#              two buffer sets), without the region made ahead, with each
#              session's own arena, with cuDNN workspaces bounded, without search, and with
#              onnxruntime's own arena growth; the CUDA tests with each session's own arena
#   amp-variants  the ResNet50 AMP row with and without BatchNormRowStatistics / HalfColumnSums
#              / PadBeforeTranspose / HalfAffinePairs, and with the EP's prefer_nhwc kernels
#   first-call the first ResNet50 train call in fresh processes, empty then filled caches
#              (passes, CUDA train sessions), then the speed rows with cuDNN's heuristic pick
#   kernels    each kernel's time in CUDA graph replays (bench/gpu_kernels.py: ResNet50 AMP,
#              float32, BERT-base), the GPU's busy time beside the step's
#   shared-arena  the CUDA tests and memory rows with one shared CUDA arena, the speed rows
#              as shipped and shared, BERT's AMP row, the first ResNet50 call
#   next       the open questions of the last notes in one call, most wanted first: the CUDA
#              tests (variables in the shared arena; accumulation on the device), where a replayed ResNet50 AMP step's time goes (kernels by family), BERT's memory row
#              as shipped and without CUDA graphs, the ResNet50 speed rows, a first call
#   forms      standard-ONNX formulations of the optimizer's axpby and the batch norm
#              backward's per-row (half) and per-channel (float32) sums, timed side by side
#              on the CUDA EP (kernel_forms.py)
#   first-look the checks a short loan affords, most wanted first: the GPU-only tests, the
#              peak-memory rows (ResNet50 AMP and fp32, BERT AMP), then the ResNet50 speed rows
#   "CMD"      anything else is run as a command with the same setup
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
if [ ! -d /tmp/site/onnxruntime ]; then
  mkdir -p /tmp/site && cat /tmp/gw/part.* | xz -d -T0 | tar -x -C /tmp/site || exit 3
fi
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
[ -d shared ] && ln -sfn "$PWD/shared" ../shared
python3 - <<'PY' || exit 4
import onnxruntime as ort
from onnxjob.runtime import backend
assert backend.cuda_usable(), ort.get_available_providers()
import torch
print("onnxruntime", ort.__version__, "CUDA EP usable; torch", torch.__version__,
      torch.cuda.get_device_name(0))
PY
start=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - start) )); }
case "$1" in
  gpu-tests)
    timeout "$(left 150)" python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py \
      tests/test_distributed_cuda.py tests/test_dlpack_path.py 2>&1 | tee "$out/gpu_tests.log"
    timeout "$(left 570)" python3 bench/bench_gpu.py --rows lenet,resnet50,resnet50-amp \
      --json "$out/gpu.json" 2>&1 | tee "$out/gpu.log" ;;
  suite)
    ONNXJOB_DEVICE=cuda timeout "$(left 570)" python3 -m pytest -p no:cacheprovider \
      -p no:benchmark -n 12 -v --tb=short tests > "$out/suite.log" 2>&1
    grep -E "FAILED|ERROR|passed|failed" "$out/suite.log" | tail -60 ;;
  profile)
    for amp in --amp ""; do
      CUDA_LAUNCH_BLOCKING=1 timeout "$(left 400)" python3 bench/profile_step.py resnet50 \
        --device cuda --batch 64 --steps 3 --top 15 $amp 2>&1 | tee -a "$out/profile.log"
    done
    # (batch-last: without the per-image weight-gradient columns of the early layers)
    timeout "$(left 570)" python3 bench/bench_variants.py --model resnet50 default= \
      batch-last=ONNXJOB_CONV_WGRAD=batch-last im2col=ONNXJOB_CONV_WGRAD=im2col 2>&1 \
      | tee "$out/variants.log" ;;
  serving)
    timeout "$(left 300)" python3 bench/bench_serving.py --device cuda --models lenet,resnet50 \
      --calls 500 --resnet-calls 300 2>&1 | tee "$out/serving.log"
    timeout "$(left 570)" python3 bench/bench_data_parallel.py --device cuda --model resnet50 \
      --nproc 2 --steps 6 2>&1 | tee "$out/data_parallel.log" ;;
  stages)
    # two schedules a run: ranks sharing one GPU ran out of cuDNN handles with all four
    timeout "$(left 280)" python3 bench/bench_stages.py --device cuda --rounds 10 \
      --schedules "serial,sink" 2>&1 | tee "$out/stages_sink.log"
    timeout "$(left 570)" python3 bench/bench_stages.py --device cuda --rounds 10 \
      --schedules "sink,overlap + sink" 2>&1 | tee "$out/stages_overlap.log" ;;
  bert)
    timeout "$(left 570)" python3 bench/bench_gpu.py \
      --rows bert-amp,resnet50-amp-memory,resnet50-memory,bert-amp-memory \
      --json "$out/gpu_bert.json" 2>&1 | tee "$out/gpu_bert.log" ;;
  amp-variants)
    # the AMP step with and without the CUDA-only AMP passes whose GPU speed is not measured
    # yet: BatchNormRowStatistics (LayerNormalization statistics of 7x7 rows at layer4),
    # HalfColumnSums (bias gradients as half matrix-vector products), PadBeforeTranspose
    # (the weight gradients' windows padded on NCHW, onnxruntime's own Pad kernel for it),
    # HalfAffinePairs (a half Mul for one of batch norm's backward affines), BatchBackwardCasts
    # (the backward's ~200 casts of per-channel vectors to half as one)
    # (the newest first: a stage cut at its time limit drops the last); then the EP's NHWC
    # kernels (prefer_nhwc: half convolutions on tensor cores without cuDNN's transposes,
    # onnxruntime's layout transformer adding Transposes where an op has no NHWC kernel)
    for skip in "" BatchBackwardCasts BatchNormRowStatistics HalfColumnSums PadBeforeTranspose \
        HalfAffinePairs; do
      echo "== ONNXJOB_SKIP_PASSES=$skip" | tee -a "$out/amp_variants.log"
      ONNXJOB_SKIP_PASSES=$skip timeout "$(left 570)" python3 bench/bench_gpu.py \
        --rows resnet50-amp --cuda-graph on 2>&1 | tee -a "$out/amp_variants.log"
      if [ -z "$skip" ]; then
        echo "== prefer_nhwc=1" | tee -a "$out/amp_variants.log"
        timeout "$(left 570)" python3 bench/bench_gpu.py --rows resnet50-amp --cuda-graph on \
          --cuda-options prefer_nhwc=1 2>&1 | tee -a "$out/amp_variants.log"
      fi
    done ;;
  memory)
    # where the two AMP memory rows' bytes go beyond the plan: as shipped, then cuDNN's
    # workspaces bounded at 32 MiB (onnxruntime's exhaustive search otherwise sizes its
    # scratch buffer by the largest algorithm, and the arena keeps it), then also cuDNN's
    # heuristic pick (no search), then the arena growing by powers of two (onnxruntime's
    # default) instead of by exactly the size asked (fragmentation)
    # as shipped: one arena per GPU for every session, given one region of the first train
    # step's planned size ahead (runtime/arena_reserve.py); then without the region, then
    # each session's own arena
    for variant in "" "ONNXJOB_CUDA_GRAPH=0" "ONNXJOB_ARENA_RESERVE=0" \
        "ONNXJOB_CUDA_SHARED_ARENA=0" \
        "--cuda-options cudnn_conv_use_max_workspace=0" \
        "--cuda-options cudnn_conv_use_max_workspace=0 --algo-search HEURISTIC" \
        "--cuda-options arena_extend_strategy=kNextPowerOfTwo"; do
      echo "== memory rows $variant" | tee -a "$out/memory.log"
      envs=(); flags=()
      for word in $variant; do
        case "$word" in ONNXJOB_*=*) envs+=("$word") ;; *) flags+=("$word") ;; esac
      done
      env "${envs[@]}" timeout "$(left 570)" python3 bench/bench_gpu.py "${flags[@]}" \
        --memory-steps 3 --rows resnet50-amp-memory,bert-amp-memory 2>&1 | tee -a "$out/memory.log"
    done
    # each session's own arena: the CUDA train steps (CUDA graphs, in-place state)
    ONNXJOB_CUDA_SHARED_ARENA=0 timeout "$(left 590)" python3 -m pytest -q -p no:cacheprovider \
      tests/test_cuda.py tests/test_in_place.py 2>&1 | tail -5 | tee -a "$out/memory.log" ;;
  first-call)
    for amp in "" --amp; do
      timeout "$(left 280)" python3 bench/bench_startup.py resnet50 --batch 64 --runs 1 $amp \
        2>&1 | tee -a "$out/first_call.log"
    done
    timeout "$(left 570)" python3 bench/bench_gpu.py --rows resnet50,resnet50-amp --cuda-graph on \
      --algo-search HEURISTIC 2>&1 | tee -a "$out/first_call.log" ;;
  kernels)
    # the kernels as the GPU ran them in CUDA graph replays (CUPTI through PyTorch's
    # profiler), ResNet50 AMP and float32 by family, then BERT-base
    for model in "resnet50 --amp" "resnet50" "bert"; do
      timeout "$(left 560)" python3 bench/gpu_kernels.py $model --by-family --top 25 2>&1 \
        | tee -a "$out/kernels.log"
    done ;;
  shared-arena)
    # one CUDA arena for every session with a region made ahead (runtime/arena_reserve.py):
    # the CUDA tests on it, its memory rows, then the speed rows as shipped (the kernel cuts
    # of graph/traffic.py's count) and on the shared arena, BERT's AMP row, the first calls
    ONNXJOB_CUDA_SHARED_ARENA=1 timeout "$(left 90)" python3 -m pytest -q -p no:cacheprovider \
      tests/test_cuda.py 2>&1 | tail -8 | tee "$out/gpu_tests_shared.log"
    ONNXJOB_CUDA_SHARED_ARENA=1 timeout "$(left 220)" python3 bench/bench_gpu.py --memory-steps 3 \
      --memory-timeout 150 --rows resnet50-amp-memory,bert-amp-memory,resnet50-memory \
      --json "$out/memory_shared.json" 2>&1 | tee "$out/memory_shared.log"
    timeout "$(left 330)" python3 bench/bench_gpu.py --rows resnet50,resnet50-amp --cuda-graph on \
      --json "$out/speed.json" 2>&1 | tee "$out/speed.log"
    timeout "$(left 410)" python3 bench/bench_gpu.py --rows bert-amp --json "$out/bert.json" \
      2>&1 | tee "$out/bert.log"
    ONNXJOB_CUDA_SHARED_ARENA=1 timeout "$(left 500)" python3 bench/bench_gpu.py \
      --rows resnet50-amp --cuda-graph on 2>&1 | tee "$out/speed_shared.log"
    timeout "$(left 570)" python3 bench/bench_startup.py resnet50 --batch 64 --runs 1 2>&1 \
      | tee "$out/first_call.log" ;;
  next)
    timeout "$(left 100)" python3 -m pytest -q -s -p no:cacheprovider -rs tests/test_cuda.py \
      2>&1 | tee "$out/gpu_tests.log" | grep -E "device memory|passed|failed|FAILED|Error" | tail -20
    # one GPU's accumulating step on the device (runtime/device_accumulation.py) vs the host
    ONNXJOB_DEVICE=cuda timeout "$(left 140)" python3 -m pytest -q -p no:cacheprovider -rs \
      tests/test_gradient_accumulation.py 2>&1 | tail -8 | tee -a "$out/gpu_tests.log"
    timeout "$(left 230)" python3 bench/gpu_kernels.py resnet50 --amp --by-family --top 25 2>&1 \
      | tee "$out/kernels.log"
    for variant in "" "ONNXJOB_CUDA_GRAPH=0"; do
      echo "== BERT memory row $variant" | tee -a "$out/memory.log"
      env $variant timeout "$(left 380)" python3 bench/bench_gpu.py --memory-steps 3 \
        --memory-timeout 120 --rows bert-amp-memory 2>&1 | tee -a "$out/memory.log"
    done
    timeout "$(left 500)" python3 bench/bench_gpu.py --rows resnet50,resnet50-amp --cuda-graph on \
      --json "$out/speed.json" 2>&1 | tee "$out/speed.log"
    timeout "$(left 570)" python3 bench/bench_startup.py resnet50 --batch 64 --runs 1 2>&1 \
      | tee "$out/first_call.log" ;;
  forms)
    timeout "$(left 570)" python3 bench/kernel_forms.py --device cuda 2>&1 \
      | tee "$out/kernel_forms.log" ;;
  first-look)
    timeout "$(left 100)" python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py 2>&1 \
      | tail -25 | tee "$out/gpu_tests.log"
    ONNXJOB_DEVICE=cuda timeout "$(left 140)" python3 -m pytest -q -p no:cacheprovider -rs \
      tests/test_gradient_accumulation.py 2>&1 | tail -8 | tee -a "$out/gpu_tests.log"
    timeout "$(left 300)" python3 bench/bench_gpu.py --memory-steps 3 --memory-timeout 150 \
      --rows resnet50-amp-memory,resnet50-memory,bert-amp-memory --json "$out/memory.json" 2>&1 \
      | tee "$out/memory.log"
    timeout "$(left 470)" python3 bench/bench_gpu.py --rows resnet50,resnet50-amp --cuda-graph on \
      --json "$out/speed.json" 2>&1 | tee "$out/speed.log" ;;
  *) eval "$1" ;;
esac
