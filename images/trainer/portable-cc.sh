#!/bin/sh
# The C and C++ compiler of the trainer image's DeepSpeed build (images/trainer.Dockerfile installs this
# file as /opt/portable-cc/gcc and /opt/portable-cc/g++): the real one of that name, with the build
# host's CPU flags replaced by a portable target.
#
# DeepSpeed 0.19.8's CPU op builder (CPUAdam) always passes -march=native and a SIMD macro read from
# the build host's CPU flags (op_builder/builder.py: cpu_arch, simd_width; no setting overrides them,
# deepspeedai/DeepSpeed#5451), which ties the op to whatever machine built the image: built on an
# AVX-512 host it dies with an illegal instruction on a node without AVX-512. Here -march=native
# becomes x86-64-v3 (AVX2 and FMA: every x86 host CPU of an H200 node has them) and DeepSpeed's
# AVX-512 code path its AVX2 one.
set -eu
for arg do
    shift
    case "$arg" in
        -march=native) arg=-march=x86-64-v3 ;;
        -mtune=native) arg=-mtune=generic ;;
        -D__AVX512__) arg=-D__AVX256__ ;;
    esac
    set -- "$@" "$arg"
done
exec "/usr/bin/$(basename "$0")" "$@"
