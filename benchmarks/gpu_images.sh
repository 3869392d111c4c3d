#!/bin/sh
# Issue 39's GPU run, as one command on the device machine (from the repository root):
#
#     sh benchmarks/gpu_images.sh [VIT-B-32-CHECKPOINT]
#
# With a checkpoint (OpenAI ViT-B-32 weights: QuickGELU) the mixed-precision top-1 agreement is meaningful; without
# one a random-weight ViT-B-32 is built (speed only). The machine has no network: torch with CUDA, torchvision,
# open_clip and svgen's dependencies must be carried there in a virtual environment (run's `carry`), named by
# PYTHON (default: python). Writes bench-results/images-cuda-vit.json and the GPU table of docs/performance.md,
# then runs the image tests, whose CUDA checks run only there.
set -e
PY=${PYTHON:-python}
if [ -n "$1" ]; then MODEL="--model ViT-B-32 --checkpoint $1 --quick-gelu"; else MODEL="--random-vit"; fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
$PY -m benchmarks.bench_images --device cuda --n 12000 $MODEL --text-classes 1000 --rounds 2 --write-docs
$PY -m pytest -q -p no:cacheprovider tests/encoders/test_image_speed.py
