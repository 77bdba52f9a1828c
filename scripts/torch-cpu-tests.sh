#!/usr/bin/env bash
# The torch op library on a machine without a GPU: installs torch (the PyPI build, without its
# pip-packaged CUDA libraries, with the three it cannot load without and which a CUDA toolkit does
# not ship) into build/torch-site and transformers into build/transformers-site, builds
# libjfa_torch.so against torch, and runs the torch tests and the transformers integration's on
# the CPU (native ops, then JFA_TORCH_OPS=ctypes). Where torch cannot be installed or imported it
# says why and exits 0: these tests also run on the GPU machine (scripts/gpu-check.sh).
#
# usage: scripts/torch-cpu-tests.sh BUILD_DIR   (a configured CMake build of libjfa)
# env:   JFA_SKIP_TORCH=1 skips; TORCH_VERSION (default 2.11.0), TRANSFORMERS_VERSION (5.25.0)
set -uo pipefail
BUILD=${1:?usage: scripts/torch-cpu-tests.sh BUILD_DIR}
cd "$(dirname "$0")/.."
if [ -n "${JFA_SKIP_TORCH:-}" ]; then
  echo "torch tests on the CPU: skipped (JFA_SKIP_TORCH)"
  exit 0
fi
SITE=$PWD/build/torch-site
if [ ! -d "$SITE/torch" ]; then
  echo "installing torch ${TORCH_VERSION:-2.11.0} (a download of ~850 MB, ~1.8 GB installed) into build/torch-site (log: $BUILD/torch-install.log) ..."
  python3 -m pip install -q --no-deps --target "$SITE" "torch==${TORCH_VERSION:-2.11.0}" \
    nvidia-cufile nvidia-cusparselt-cu13 nvidia-nvshmem-cu13 filelock fsspec sympy mpmath \
    networkx jinja2 markupsafe typing_extensions >"$BUILD/torch-install.log" 2>&1 ||
    { echo "torch tests on the CPU: skipped (pip could not install torch; see $BUILD/torch-install.log)"; exit 0; }
fi
# transformers (pure Python) and its dependencies beside torch, for the integration's tests; where
# pip cannot install it those tests say so and skip.
TF_SITE=$PWD/build/transformers-site
if [ ! -d "$TF_SITE/transformers" ]; then
  echo "installing transformers ${TRANSFORMERS_VERSION:-5.25.0} (~290 MB installed) into build/transformers-site (log: $BUILD/transformers-install.log) ..."
  python3 -m pip install -q --target "$TF_SITE" "transformers==${TRANSFORMERS_VERSION:-5.25.0}" \
    >"$BUILD/transformers-install.log" 2>&1 ||
    echo "transformers could not be installed (see $BUILD/transformers-install.log): its tests skip"
fi
libs=""
for d in /usr/local/cuda/lib64 "$SITE"/nvidia/*/lib "$SITE"/nvidia/cu13/lib; do
  [ -d "$d" ] && libs="$libs:$d"
done
export PYTHONPATH="$SITE:$TF_SITE${PYTHONPATH:+:$PYTHONPATH}" LD_LIBRARY_PATH="${libs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ! why=$(python3 -c 'import torch' 2>&1); then
  echo "torch tests on the CPU: skipped (torch does not import here: $(echo "$why" | tail -1))"
  exit 0
fi
echo "building libjfa_torch.so against torch in $BUILD (log: $BUILD/torch-build.log) ..."
{ cmake -S . -B "$BUILD" -DJFA_TORCH_OPS=ON -DJFA_TORCH_DIR="$SITE/torch" &&
  cmake --build "$BUILD" --target jfa_torch -j"$(nproc)"; } >"$BUILD/torch-build.log" 2>&1 ||
  { tail -n 40 "$BUILD/torch-build.log"; echo "the torch op library did not build (see $BUILD/torch-build.log)"; exit 1; }
export JFA_LIBRARY="$PWD/$BUILD/src/libjfa.so"
echo "torch tests with the native ops ..."
python3 -m pytest tests/python/test_torch.py tests/python/test_torch_cuda_backward.py \
  tests/python/test_torch_local_attention.py tests/python/test_torch_paged.py \
  tests/python/test_transformers_integration.py \
  tests/python/test_transformers_integration_bf16.py tests/python/test_transformers_step_bench.py \
  tests/python/test_readme.py -q -rs || exit 1
echo "torch tests with JFA_TORCH_OPS=ctypes ..."
JFA_TORCH_OPS=ctypes python3 -m pytest tests/python/test_torch.py \
  tests/python/test_torch_local_attention.py tests/python/test_torch_paged.py \
  tests/python/test_transformers_integration.py \
  tests/python/test_torch_cuda_backward.py -q || exit 1
