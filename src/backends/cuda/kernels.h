// Launchers of the backend's own CUDA kernels (kernels.cu). Plain C++ signatures, so the
// op classes (compiled by the host compiler) call them without seeing device code. Every
// launcher checks its launch. Activations are NHWC: M = N*H*W rows of C channels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace rn::cuda {

// Vector accesses (16 bytes where C and the addresses allow) in the element-wise and
// per-channel kernels; RN_CUDA_VECTOR_KERNELS=0 turns them off for a process (V = 1: the
// same per-element arithmetic, per-channel sums in another fixed order). Set it before the
// first kernel runs: batch norm's recompute expects the order its forward pass used.
bool vector_kernels();
void set_vector_kernels(bool on);

void launch_cast(void* y, DType dst, const void* x, DType src, int64_t n, cudaStream_t s);
void launch_relu_forward(void* y, const void* x, DType t, int64_t n, cudaStream_t s);
// dx = dy * (y > 0); dx may be dy.
void launch_relu_backward(void* dx, const void* dy, const void* y, DType t, int64_t n, cudaStream_t s);
void launch_add(void* y, const void* a, const void* b, DType t, int64_t n, cudaStream_t s);

// Per-channel reductions over M rows into `partials` (channel_partials_floats() floats),
// finished in a fixed order: deterministic for a given M and C.
int64_t channel_partials_floats(int64_t M, int64_t C);

// Batch statistics: mean[C], biased var[C] (fp32) of x.
void launch_bn_stats(float* mean, float* var, const void* x, DType t, int64_t M, int64_t C, float* partials,
                     cudaStream_t s);
// saved_mean = mean, saved_invstd = 1/sqrt(var + eps) (in double), running stats updated.
void launch_bn_finish_training(float* saved_mean, float* saved_invstd, float* running_mean, float* running_var,
                               const float* mean, const float* var, float eps, float momentum, int64_t M, int64_t C,
                               cudaStream_t s);
// Sets *mismatch to 1 if the recomputed statistics differ from the saved ones in any bit.
void launch_bn_compare(int* mismatch, const float* mean, const float* var, const float* saved_mean,
                       const float* saved_invstd, float eps, int64_t C, cudaStream_t s);
// fuse: 0 none, 1 relu, 2 add_relu (residual). invstd == nullptr: running_var given in
// `var_or_invstd`, inverted with eps per element (inference).
void launch_bn_apply(void* y, const void* x, const void* residual, DType t, int64_t M, int64_t C, const float* mean,
                     const float* var_or_invstd, bool is_var, float eps, const float* gamma, const float* beta,
                     int fuse, cudaStream_t s);
// Batch-norm backward of g, the gradient reaching the batch norm: g = dy, or, with the ReLU
// fused (y, its output, not null), g = dy where y > 0 and +0 elsewhere (launch_relu_backward's
// bits), applied as dy is read, in both passes.
// sum_dy[C] = sum g, sum_dy_xhat[C] = sum g * (x - mean) * invstd; masked_dy (not null: add+ReLU's
// dresidual, whose value g is; needs y) receives g in the same pass.
void launch_bn_backward_sums(float* sum_dy, float* sum_dy_xhat, void* masked_dy, const void* dy, const void* y,
                             const void* x, DType t, int64_t M, int64_t C, const float* mean, const float* invstd,
                             float* partials, cudaStream_t s);
// dx from g; dgamma += sum_dy_xhat, dbeta += sum_dy (not when dgamma is null). Each element of
// dy, y and x is read by the thread that then writes the same element of dx, so dx may be dy,
// y or x; masked_dy (sums pass) and dx must not overlap x or each other's other elements.
// The sums are scaled by inv_count, 1/M when negative (synchronised BN passes global means and 1).
void launch_bn_backward_dx(void* dx, const void* dy, const void* y, const void* x, DType t, int64_t M, int64_t C,
                           const float* mean, const float* invstd, const float* gamma, const float* sum_dy,
                           const float* sum_dy_xhat, float* dgamma, float* dbeta, cudaStream_t s,
                           float inv_count = -1.0f);

// Synchronised batch norm (ops/batch_norm.h's contract): sums[2C + 1] doubles, all-reduced
// over the ranks in device memory between the two halves.
//   forward:  sums = [sum x (C), sum x^2 (C), M]; then saved and running statistics from the
//             global sums (mean, biased var = Q/m - mean^2, running var with m/(m-1));
//   backward: sums = [sum g (C), sum g*xhat (C), M] (g: the gradient reaching the BN, dy
//             masked by y and stored into masked_dy as launch_bn_backward_sums does);
//             dbeta/dgamma += the local sums; then the global means of g and g*xhat.
void launch_bn_sync_forward_sums(double* sums, const void* x, DType t, int64_t M, int64_t C, float* partials,
                                 cudaStream_t s);
void launch_bn_sync_backward_sums(double* sums, void* masked_dy, const void* dy, const void* y, const void* x, DType t,
                                  int64_t M, int64_t C, const float* mean, const float* invstd, float* partials,
                                  cudaStream_t s);
void launch_bn_sync_finish_forward(float* saved_mean, float* saved_invstd, float* running_mean, float* running_var,
                                   const double* sums, float eps, float momentum, int64_t C, cudaStream_t s);
void launch_bn_sync_finish_backward(float* mean_g, float* mean_g_xhat, const double* sums, int64_t C, cudaStream_t s);
void launch_bn_sync_accumulate(float* dgamma, float* dbeta, const double* sums, int64_t C, cudaStream_t s);
// *mismatch = 1 where the 32-bit words a[0, words) and b[0, words) differ in any bit.
void launch_words_differ(int* mismatch, const void* a, const void* b, int64_t words, cudaStream_t s);

// bias: y[m, c] += b[c]; db[c] += sum_m dy[m, c].
void launch_bias_add(void* y, const float* b, DType t, int64_t M, int64_t C, cudaStream_t s);
void launch_bias_grad(float* db, const void* dy, DType t, int64_t M, int64_t C, float* partials, cudaStream_t s);

// Weights: PyTorch's KCRS into cuDNN's KRSC, and the KRSC gradient added into fp32 KCRS.
void launch_kcrs_to_krsc(void* dst, const void* src, DType t, int64_t K, int64_t C, int64_t R, int64_t S,
                         cudaStream_t s);
void launch_accumulate_krsc_to_kcrs(float* dst, const void* src, DType t, int64_t K, int64_t C, int64_t R, int64_t S,
                                    cudaStream_t s);
// dst[i] += float(src[i])
void launch_accumulate(float* dst, const void* src, DType t, int64_t n, cudaStream_t s);

// Max pooling, NHWC; the workspace holds the int32 input row (h*W + w) of each output's max.
void launch_max_pool_forward(void* y, int32_t* argmax, const void* x, DType t, int64_t N, int64_t C, int64_t H,
                             int64_t W, int64_t P, int64_t Q, int64_t k, int64_t stride, int64_t pad, cudaStream_t s);
void launch_max_pool_backward(void* dx, const void* dy, const int32_t* argmax, DType t, int64_t N, int64_t C, int64_t H,
                              int64_t W, int64_t P, int64_t Q, int64_t k, int64_t stride, int64_t pad, cudaStream_t s);
void launch_global_avg_pool_forward(void* y, const void* x, DType t, int64_t N, int64_t C, int64_t HW, cudaStream_t s);
void launch_global_avg_pool_backward(void* dx, const void* dy, DType t, int64_t N, int64_t C, int64_t HW,
                                     cudaStream_t s);

// Softmax cross-entropy (fp32). A label outside [0, K) makes that sample's loss NaN and
// sets *bad_label to its index + 1.
void launch_softmax_ce_forward(float* loss, float* probs, float* per_sample, const float* logits, const int32_t* labels,
                               int64_t N, int64_t K, float smoothing, int* bad_label, cudaStream_t s);
// grad_scale * (*scale_source when not null).
void launch_softmax_ce_backward(float* dlogits, const float* probs, const int32_t* labels, int64_t N, int64_t K,
                                float smoothing, float grad_scale, const float* scale_source, cudaStream_t s);

}  // namespace rn::cuda
