// Chapter 10's tables of layer kernels (chapter 09's nn::LayerKernels), registered with chapter
// 09's registry as a program starts, so that 09_resnet --kernels can run them:
//   raw    the raw CUDA kernels (kernels.h) for im2col, col2im, BatchNorm's three sums and its
//          apply; chapter 09's convolution plan (the whole batch unfolded, then GEMMs) around
//          them. The cuda build's default: 4.4 times chapter 09's functors on one H200
//          (README). In the cpu build the same per-thread code runs on the CPU, correct but slow.
//   tiled  the convolution a few images at a time (tiled_conv.h), each tile's col in a core's
//          cache; chapter 09's BatchNorm. The cpu build's default (README: the CPU section).
//   tensor raw, but the 3x3 stride-1 convolutions as an implicit GEMM in bf16 on tensor cores
//          (implicit_gemm.h), col never written; with --precision bf16 only. On a CPU the
//          instruction's host model runs it: correct, slow.
// chapters/10_fast_kernels/CMakeLists.txt links these tables into 09_resnet; chapter 09's own
// files know nothing of them.
#pragma once
#include "../09_resnet/layers.h"  // nn::LayerKernels

namespace fast {

const nn::LayerKernels& raw_kernels();
const nn::LayerKernels& tiled_kernels();
const nn::LayerKernels& tensor_kernels();

}  // namespace fast
