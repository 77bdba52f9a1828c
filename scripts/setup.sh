#!/usr/bin/env bash
# Installs what the build and the tests need, when it is missing (Debian/Ubuntu: apt-get, and pip
# for the Python test dependencies).
set -euo pipefail

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
command -v python3 >/dev/null || need+=(python3 python3-pip)
dpkg -s libgtest-dev >/dev/null 2>&1 || need+=(libgtest-dev)
dpkg -s libgmock-dev >/dev/null 2>&1 || need+=(libgmock-dev)
command -v clang++ >/dev/null || need+=(clang)                      # the fuzzer build
dpkg -s libclang-rt-dev >/dev/null 2>&1 || need+=(libclang-rt-dev)  # libFuzzer

if ((${#need[@]})); then
  echo "setup: installing ${need[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi

# Python side: numpy and pytest for the package tests (pip first, Debian's packages otherwise).
if ! python3 -c 'import numpy, pytest' 2>/dev/null; then
  echo "setup: installing numpy and pytest"
  if ! python3 -m pip install -q numpy pytest 2>/dev/null; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-numpy python3-pytest
  fi
fi

cmake_version=$(cmake --version | head -n1 | awk '{print $3}')
if ! printf '3.25\n%s\n' "$cmake_version" | sort -V -C; then
  echo "setup: CMake >= 3.25 is required, found $cmake_version" >&2
  exit 1
fi
