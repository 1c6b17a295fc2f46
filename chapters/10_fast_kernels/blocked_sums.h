// BatchNorm's channel sums for a CPU, the "tiled" table's: each channel's row read a block at a
// time, the block's sums kept in a vector of partial sums, and the forward pass's two statistics
// from ONE read of z.
//
// Why. Chapter 09's sums (layers.cu, SliceSums with one slice a channel on a CPU) add a channel's
// n values one after the other into one double: every add waits for the one before it (about 4
// cycles each), so a core reads z at a quarter of what it could, and the forward pass reads z
// twice, once for the mean and once for the squares about it, because the one-read formula
// E[z^2] - E[z]^2 loses its digits (layers.h says how many). Here:
//   - a block of kBlock values (8 KB: it stays in the core's L1 cache) is summed into kLanes
//     independent partial sums, which the compiler keeps in one vector register: no add waits
//     for another;
//   - the statistics take one read of z from memory: per block, its sum, then the squares about
//     the block's own mean, read again from L1; the blocks' (count, mean, M2) are merged one by
//     one with the exact formula of Chan, Golub and LeVeque (1979): for n = n_a + n_b and
//     delta = mean_b - mean_a, mean = mean_a + delta n_b / n and M2 = M2_a + M2_b + delta^2 n_a n_b / n.
//     No E[z^2] - E[z]^2 anywhere: each block's squares are about its own mean.
// Sums in double, as chapter 09's; in another order, so the last bits differ (test_fast_kernels
// holds them to within rounding of chapter 09's). One item a channel: the device's threads share
// the channels. (In the cuda build these compile and run too, one GPU thread a channel: correct
// and slow. A GPU's sums are the "raw" table's.)
#pragma once
#include <cstdint>

#include "../09_resnet/layers.h"  // the functions these stand in for, ReductionScratch
#include "common/device.h"

namespace fast {

using mgpu::Device;

constexpr int kBlock = 2048;  // values a block: 8 KB of floats
constexpr int kLanes = 8;     // partial sums a block: doubles, one 512-bit register or two 256-bit ones

// nn::LayerKernels::batch_norm_moments in one read of z [C][n]: sums [2][C] = (sum z, sum (z - mean)^2), mean
// the channel's; n >= 1 (else mgpu::Error).
void batch_norm_moments_blocked(const Device& d, const float* z, int channels, std::int64_t n, float* sums);
// nn::batch_norm_sums and nn::batch_norm_square_sums, block by block (SyncBN's two passes).
void batch_norm_sums_blocked(const Device& d, const float* z, int channels, std::int64_t n, float* sums);
void batch_norm_square_sums_blocked(const Device& d, const float* z, int channels, std::int64_t n, double count,
                                    float* sums);
// nn::batch_norm_backward_sums, block by block: sums [2][C] = (sum dy, sum dy * xhat); dbeta and
// dgamma (may be null) += them.
void batch_norm_backward_sums_blocked(const Device& d, const float* dy, const float* z, int channels, std::int64_t n,
                                      const float* stats, float* sums, float* dgamma, float* dbeta);

}  // namespace fast
