// LeNet's layers, forward and backward, written once for both backends.
//
// Layout. Activations are stored channel-major: [C][B][H][W] ("CNHW"), and the dense
// layers' activations are [features][B]. With that layout a convolution over the whole
// batch is ONE matrix product, W [Cout x C*k*k] times the unfolded input [C*k*k x B*Ho*Wo],
// and its result is already the next layer's input, [Cout][B][Ho][Wo]; no transposes.
// The weights keep d2l's shapes: conv W [Cout][C][k][k], dense W [in][out].
//
// Conventions. Forward functions overwrite their outputs. Backward functions ADD the
// parameter gradients into dW and db (so a batch can be processed in chunks and the
// gradients sum up) and overwrite the input gradient dx; dx == nullptr skips it.
// Forward layers add their bias and apply their activation in one pass over the output
// (bias_activation). `ones` is a vector of 1.0f at least as long as the longest row a backward
// pass meets: a bias gradient is the product dz * ones (each row of dz summed).
#pragma once
#include <cstdint>

#include "common/device.h"

namespace lenet {

using mgpu::Device;

struct ImageShape {  // the shape of a [C][B][H][W] tensor
  int channels, batch, height, width;
  std::int64_t size() const { return std::int64_t(channels) * batch * height * width; }
};

// --- convolution (valid padding, stride 1) through im2col + GEMM
// col [C*k*k][B*Ho*Wo]: row (c, ky, kx), column (b, oy, ox) holds x[c][b][oy+ky][ox+kx].
void im2col(const Device& d, const float* x, ImageShape xs, int k, float* col);
// The adjoint of im2col: dx[c][b][y][x] = sum of every col entry that copied x[c][b][y][x].
void col2im(const Device& d, const float* col, ImageShape xs, int k, float* dx);

// What a layer applies to its output after the bias: nothing, or ReLU (max(z, 0)).
enum class Activation { None, Relu };

// z [rows][row_length] = act(z + b), b [rows] broadcast along each row: the bias added and the
// activation applied in one pass over z.
void bias_activation(const Device& d, float* z, const float* b, int rows, std::int64_t row_length, Activation act);

// z [Cout][B][Ho][Wo] = act(W * im2col(x) + b); col (scratch, kept for the backward pass).
void conv2d_forward(const Device& d, const float* x, ImageShape xs, const float* W, const float* b,
                    int out_channels, int k, Activation act, float* col, float* z);
// From dz [Cout][B][Ho][Wo] and the forward pass's col: dW += dz col^T, db += dz ones,
// dx = col2im(W^T dz) (dcol is scratch of col's size; dx == nullptr skips dcol and dx).
void conv2d_backward(const Device& d, const float* dz, ImageShape xs, const float* W, int out_channels, int k,
                     const float* col, const float* ones, float* dW, float* db, float* dcol, float* dx);
// Its three products, for any way of unfolding the input: from dz [Cout][P] and col [K][P],
// dW [Cout][K] += dz col^T, db [Cout] += dz ones (ones: P values of 1), and dcol [K][P] = W^T dz
// (dcol == nullptr skips it). Chapter 09's convolutions (strides, padding) reuse it between
// their own im2col and col2im.
void conv2d_backward_products(const Device& d, const float* dz, const float* col, const float* W, const float* ones,
                              int out_channels, int K, int P, float* dW, float* db, float* dcol);

// --- ReLU, in place. Backward: dh *= (h > 0), where h is the forward output. (LeNet's forward
// ReLUs are fused into bias_activation, the convolutions' backward ones into avgpool2_backward;
// dense3's backward is this relu_backward.)
void relu_forward(const Device& d, float* z, std::int64_t n);
void relu_backward(const Device& d, const float* h, float* dh, std::int64_t n);

// --- 2x2 average pooling, stride 2: y [C][B][H/2][W/2]. An odd last row/column is
// dropped, as PyTorch's avg_pool2d does (LeNet's 9x9 -> 4x4).
void avgpool2_forward(const Device& d, const float* x, ImageShape xs, float* y);
// With relu_output (the ReLU output h that was pooled), ReLU's backward is applied too:
// dx is zero wherever h <= 0, so that dx is the gradient with respect to the ReLU's input.
void avgpool2_backward(const Device& d, const float* dy, ImageShape xs, float* dx,
                       const float* relu_output = nullptr);

// --- flatten [C][B][H][W] -> [C*H*W][B] (feature f = (c*H + y)*W + x, d2l's order); and back.
void flatten(const Device& d, const float* x, ImageShape xs, float* y);
void unflatten(const Device& d, const float* dy, ImageShape xs, float* dx);

// --- dense: z [out][B] = act(W^T x + b), with W [in][out] (d2l's torch.mm(X, W) + b, transposed).
void dense_forward(const Device& d, const float* x, int in, int batch, const float* W, const float* b, int out,
                   Activation act, float* z);
void dense_backward(const Device& d, const float* dz, const float* x, int in, int batch, const float* W, int out,
                    const float* ones, float* dW, float* db, float* dx);

// --- softmax cross-entropy per example, from logits [classes][B] and labels [B]:
// loss[b] = log(sum_c exp z[c][b]) - z[y_b][b]; correct[b] = 1 when argmax is y_b.
// dlogits [classes][B] = softmax(z) - onehot(y), the gradient of sum_b loss[b]; nullptr skips it.
void softmax_cross_entropy(const Device& d, const float* logits, const std::int32_t* labels, int classes,
                           int batch, float* loss, float* correct, float* dlogits);

// The element-wise kernels a training step runs besides these layers (mgpu::sgd_update, mgpu::fill,
// mgpu::add_into) are in common/vector_ops.h: this chapter teaches them, every chapter uses them.

}  // namespace lenet
