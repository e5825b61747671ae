#pragma once
/// Element-wise math of the trainer, written once for every backend.
///
/// Every function here is `GRACE_HD inline`: plain arithmetic and C math
/// (`expf`, `logf`, `sqrtf`, `cosf`), no `std::` calls, so a CUDA backend
/// compiles exactly these formulas for the device. The CPU backend (mlp.cpp)
/// does its matrix products through BLAS and everything else through here.
///
/// Bit-identical results across runs rely on each formula being evaluated in
/// a fixed order; do not compile callers with -ffast-math.

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define GRACE_HD __host__ __device__
#else
#define GRACE_HD
#endif

namespace grace {
namespace kernels {

// ---------------------------------------------------------------------------
// Activations
// ---------------------------------------------------------------------------

/// ReLU forward.
GRACE_HD inline float relu(float x) { return x > 0.0f ? x : 0.0f; }

/// ReLU backward, from the layer's *output* y = relu(x): d/dx passes `dy`
/// where the unit was active. Using the output means the pre-activation
/// need not be kept.
GRACE_HD inline float relu_backward(float dy, float y) { return y > 0.0f ? dy : 0.0f; }

/// row[k] += bias[k] for one row of `n` elements.
GRACE_HD inline void bias_add_row(float* row, const float* bias, int n) {
  for (int k = 0; k < n; ++k) row[k] += bias[k];
}

// ---------------------------------------------------------------------------
// Softmax + cross-entropy, one row
// ---------------------------------------------------------------------------

/// Numerically stable softmax of one row: probs[k] = exp(x_k - max) / sum.
/// `probs` may alias `logits`.
GRACE_HD inline void softmax_row(const float* logits, int n, float* probs) {
  float m = logits[0];
  for (int k = 1; k < n; ++k) m = logits[k] > m ? logits[k] : m;
  float sum = 0.0f;
  for (int k = 0; k < n; ++k) sum += expf(logits[k] - m);
  const float inv = 1.0f / sum;
  for (int k = 0; k < n; ++k) probs[k] = expf(logits[k] - m) * inv;
}

/// Cross-entropy loss of one row, -log softmax(logits)[label], computed as
/// logsumexp(logits) - logits[label] (never takes the log of a rounded-to-0
/// probability). Writes the gradient with respect to the logits, scaled:
/// grad[k] = scale * (softmax_k - [k == label]). `grad` may alias `logits`.
/// Returns the unscaled loss.
GRACE_HD inline float softmax_xent_row(const float* logits, int label, int n, float* grad, float scale) {
  float m = logits[0];
  for (int k = 1; k < n; ++k) m = logits[k] > m ? logits[k] : m;
  float sum = 0.0f;
  for (int k = 0; k < n; ++k) sum += expf(logits[k] - m);
  const float lse = m + logf(sum);
  const float loss = lse - logits[label];
  const float inv = 1.0f / sum;
  for (int k = 0; k < n; ++k) {
    const float p = expf(logits[k] - m) * inv;
    grad[k] = scale * (p - (k == label ? 1.0f : 0.0f));
  }
  return loss;
}

// ---------------------------------------------------------------------------
// Optimizer
// ---------------------------------------------------------------------------

/// SGD with momentum (PyTorch convention, no dampening) for one element:
///   g += wd * w;  v = mu * v + g;  w -= lr * v.
GRACE_HD inline void sgd_momentum(float& w, float& v, float g, float lr, float mu, float wd) {
  if (wd != 0.0f) g += wd * w;
  v = mu * v + g;
  w -= lr * v;
}

// ---------------------------------------------------------------------------
// Counter-based RNG: a pure function of (seed, stream, a, b), no state, so
// any sample or weight can be regenerated anywhere, in any order, on any
// worker. splitmix64 finaliser chained over the inputs.
// ---------------------------------------------------------------------------

/// Distinct streams so data, teacher and initial weights never correlate.
enum rng_stream : uint64_t {
  stream_data = 0x64617461ull,     ///< features of sample (i, j)
  stream_teacher = 0x74656163ull,  ///< teacher weights (class, j)
  stream_init = 0x696e6974ull,     ///< initial weights: stream_init + layer
};

GRACE_HD inline uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// 64 random bits for (seed, stream, a, b).
GRACE_HD inline uint64_t hash4(uint64_t seed, uint64_t stream, uint64_t a, uint64_t b) {
  uint64_t h = splitmix64(seed ^ 0x6a09e667f3bcc909ull);
  h = splitmix64(h ^ stream);
  h = splitmix64(h ^ a);
  h = splitmix64(h ^ b);
  return h;
}

/// 24 random bits -> uniform float in the open interval (0, 1): never 0, so
/// logf is safe, and exactly representable.
GRACE_HD inline float bits_to_unit(uint32_t bits24) {
  return (static_cast<float>(bits24) + 0.5f) * (1.0f / 16777216.0f);
}

/// Uniform float in (0, 1) for (seed, stream, a, b).
GRACE_HD inline float uniform(uint64_t seed, uint64_t stream, uint64_t a, uint64_t b) {
  return bits_to_unit(static_cast<uint32_t>(hash4(seed, stream, a, b) >> 40));
}

/// Standard normal float for (seed, stream, a, b) by Box-Muller on two
/// 24-bit uniforms taken from one 64-bit hash.
GRACE_HD inline float normal(uint64_t seed, uint64_t stream, uint64_t a, uint64_t b) {
  const uint64_t h = hash4(seed, stream, a, b);
  const float u1 = bits_to_unit(static_cast<uint32_t>(h >> 40));
  const float u2 = bits_to_unit(static_cast<uint32_t>((h >> 16) & 0xffffffu));
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

}  // namespace kernels
}  // namespace grace
