// Tests for runtime/train/kernels.hpp and runtime/mlp.{hpp,cpp}.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/train/kernels.hpp"
#include "runtime/train/mlp.hpp"

using namespace grace;

namespace {

mlp_config tiny_config() {
  mlp_config c;
  c.input_dim = 8;
  c.hidden = {16, 12};
  c.classes = 4;
  c.global_batch = 16;
  c.lr = 0.05f;
  c.momentum = 0.9f;
  c.seed = 7;
  return c;
}

float xent_loss(const std::vector<float>& logits, int label) {
  std::vector<float> g(logits.size());
  return kernels::softmax_xent_row(logits.data(), label, static_cast<int>(logits.size()), g.data(), 1.0f);
}

}  // namespace

TEST_CASE("kernels: relu forward and backward", "[kernels]") {
  CHECK(kernels::relu(-1.5f) == 0.0f);
  CHECK(kernels::relu(0.0f) == 0.0f);
  CHECK(kernels::relu(2.5f) == 2.5f);
  CHECK(kernels::relu_backward(3.0f, 0.0f) == 0.0f);
  CHECK(kernels::relu_backward(3.0f, 0.25f) == 3.0f);
  float row[3] = {1, 2, 3};
  const float b[3] = {0.5f, -2, 0};
  kernels::bias_add_row(row, b, 3);
  CHECK(row[0] == 1.5f);
  CHECK(row[1] == 0.0f);
  CHECK(row[2] == 3.0f);
}

TEST_CASE("kernels: softmax sums to one and is stable for huge logits", "[kernels]") {
  const float logits[4] = {1000.0f, 1001.0f, 999.0f, -1000.0f};
  float p[4];
  kernels::softmax_row(logits, 4, p);
  float sum = 0;
  for (float v : p) {
    CHECK(std::isfinite(v));
    sum += v;
  }
  CHECK(sum == Approx(1.0f).epsilon(1e-6));
  CHECK(p[1] > p[0]);
  CHECK(p[3] == 0.0f);

  float g[4];
  const float loss = kernels::softmax_xent_row(logits, 3, 4, g, 1.0f);
  CHECK(std::isfinite(loss));
  CHECK(loss == Approx(2001.0f + std::log(1.0f + std::exp(-1.0f) + std::exp(-2.0f))).epsilon(1e-5));
}

TEST_CASE("kernels: softmax cross-entropy gradient matches finite differences", "[kernels]") {
  const std::vector<float> logits = {0.3f, -1.2f, 2.0f, 0.7f, -0.4f};
  for (int label = 0; label < 5; ++label) {
    std::vector<float> g(5);
    const float scale = 0.25f;
    const float loss = kernels::softmax_xent_row(logits.data(), label, 5, g.data(), scale);
    CHECK(loss == Approx(xent_loss(logits, label)));
    for (int k = 0; k < 5; ++k) {
      const float eps = 1e-2f;
      auto up = logits, down = logits;
      up[k] += eps;
      down[k] -= eps;
      const double fd = (double(xent_loss(up, label)) - double(xent_loss(down, label))) / (2 * eps);
      CHECK(g[k] == Approx(scale * fd).margin(2e-4));
    }
  }
  // In place (grad aliases logits).
  std::vector<float> inplace = logits, g(5);
  kernels::softmax_xent_row(logits.data(), 2, 5, g.data(), 1.0f);
  kernels::softmax_xent_row(inplace.data(), 2, 5, inplace.data(), 1.0f);
  CHECK(std::memcmp(inplace.data(), g.data(), 5 * sizeof(float)) == 0);
}

TEST_CASE("kernels: sgd with momentum gives exact values", "[kernels]") {
  float w = 2.0f, v = 1.0f;
  kernels::sgd_momentum(w, v, 0.5f, /*lr=*/0.5f, /*mu=*/0.5f, /*wd=*/0.0f);
  CHECK(v == 1.0f);  // 0.5*1 + 0.5
  CHECK(w == 1.5f);  // 2 - 0.5*1
  kernels::sgd_momentum(w, v, 0.25f, 0.5f, 0.5f, 0.0f);
  CHECK(v == 0.75f);   // 0.5*1 + 0.25
  CHECK(w == 1.125f);  // 1.5 - 0.5*0.75

  float w2 = 2.0f, v2 = 1.0f;
  kernels::sgd_momentum(w2, v2, 0.5f, 0.5f, 0.5f, /*wd=*/0.25f);
  CHECK(v2 == 1.5f);   // g = 0.5 + 0.25*2 = 1; v = 0.5 + 1
  CHECK(w2 == 1.25f);  // 2 - 0.75
}

TEST_CASE("kernels: counter RNG is a pure function with sane distributions", "[kernels]") {
  CHECK(kernels::hash4(1, 2, 3, 4) == kernels::hash4(1, 2, 3, 4));
  CHECK(kernels::hash4(1, 2, 3, 4) != kernels::hash4(2, 2, 3, 4));
  CHECK(kernels::hash4(1, 2, 3, 4) != kernels::hash4(1, 3, 3, 4));
  CHECK(kernels::hash4(1, 2, 3, 4) != kernels::hash4(1, 2, 4, 3));
  const int n = 20000;
  double su = 0, sn = 0, sn2 = 0;
  for (int i = 0; i < n; ++i) {
    const float u = kernels::uniform(9, kernels::stream_data, i, 1);
    REQUIRE(u > 0.0f);
    REQUIRE(u < 1.0f);
    su += u;
    const float z = kernels::normal(9, kernels::stream_data, i, 2);
    REQUIRE(std::isfinite(z));
    sn += z;
    sn2 += double(z) * z;
  }
  CHECK(su / n == Approx(0.5).margin(0.01));
  CHECK(sn / n == Approx(0.0).margin(0.03));
  CHECK(sn2 / n == Approx(1.0).margin(0.04));
}

TEST_CASE("mlp: config validation", "[mlp]") {
  mlp_config c;
  CHECK(validate(c).ok());
  CHECK(validate(c, 4).ok());
  auto st = validate(c, 3);
  REQUIRE_FALSE(st.ok());
  CHECK(st.err().code == errc::invalid_input);
  c.hidden = {0};
  CHECK_FALSE(mlp::create(c).ok());
  CHECK(mlp::create(c).err().code == errc::invalid_input);
  CHECK_THROWS_AS(mlp(c), std::invalid_argument);
  mlp m(mlp_config{});
  CHECK_THROWS_AS(m.compute_gradients(0, 0, 3), std::invalid_argument);
  CHECK_THROWS_AS(m.compute_gradients(0, 4, 4), std::invalid_argument);
}

TEST_CASE("mlp: tensors have stable names, shapes and sizes", "[mlp]") {
  mlp m(tiny_config());
  auto ts = m.tensors();
  REQUIRE(ts.size() == 12);
  CHECK(ts[0].name == "layers.0.weight");
  CHECK(ts[0].shape == std::vector<int64_t>{16, 8});
  CHECK(ts[1].name == "layers.0.bias");
  CHECK(ts[1].shape == std::vector<int64_t>{16});
  CHECK(ts[4].name == "layers.2.weight");
  CHECK(ts[4].shape == std::vector<int64_t>{4, 12});
  CHECK(ts[6].name == "optimizer.momentum.layers.0.weight");
  CHECK(ts[11].name == "optimizer.momentum.layers.2.bias");
  size_t bytes = 0, params = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    CHECK(ts[i].type == dtype::f32);
    CHECK(ts[i].data != nullptr);
    bytes += ts[i].bytes();
    if (i < 6) params += ts[i].numel();
  }
  const uint64_t expect = 16 * 8 + 16 + 12 * 16 + 12 + 4 * 12 + 4;
  CHECK(m.parameter_count() == expect);
  CHECK(params == expect);
  CHECK(m.grad_size() == expect);
  CHECK(m.state_bytes() == bytes);
  CHECK(m.state_bytes() == 2 * expect * sizeof(float));
  // Pointers are stable across calls and steps.
  m.compute_gradients(0, 0, 1);
  m.apply_gradients();
  auto ts2 = m.tensors();
  for (size_t i = 0; i < ts.size(); ++i) CHECK(ts[i].data == ts2[i].data);
}

TEST_CASE("mlp: same seed gives the same model, another seed a different one", "[mlp]") {
  mlp a(tiny_config()), b(tiny_config());
  CHECK(a.weights_checksum() == b.weights_checksum());
  auto c2 = tiny_config();
  c2.seed = 8;
  mlp c(c2);
  CHECK(a.weights_checksum() != c.weights_checksum());
  // The checksum covers momentum too.
  auto t = b.tensors();
  static_cast<float*>(t.back().data)[0] = 1.0f;
  CHECK(a.weights_checksum() != b.weights_checksum());
}

TEST_CASE("mlp: worker slices are the rows of the single-worker batch", "[mlp]") {
  mlp m(tiny_config());
  const int d = tiny_config().input_dim;
  for (uint64_t step : {0ull, 5ull, 1000000ull}) {
    std::vector<float> x_all, x;
    std::vector<int> y_all, y;
    m.make_batch(step, 0, 1, x_all, y_all);
    REQUIRE(y_all.size() == 16);
    for (int r = 0; r < 4; ++r) {
      m.make_batch(step, r, 4, x, y);
      REQUIRE(y.size() == 4);
      CHECK(std::memcmp(x.data(), x_all.data() + size_t(r) * 4 * d, x.size() * sizeof(float)) == 0);
      for (int i = 0; i < 4; ++i) CHECK(y[i] == y_all[r * 4 + i]);
    }
    // make_sample agrees with make_batch.
    std::vector<float> xs(d);
    const int label = make_sample(tiny_config(), step * 16 + 5, xs.data());
    CHECK(label == y_all[5]);
    CHECK(std::memcmp(xs.data(), x_all.data() + 5 * d, d * sizeof(float)) == 0);
  }
  // Consecutive steps use disjoint samples.
  std::vector<float> x0, x1;
  std::vector<int> y0, y1;
  m.make_batch(0, 0, 1, x0, y0);
  m.make_batch(1, 0, 1, x1, y1);
  CHECK(x0 != x1);
}

TEST_CASE("mlp: labels use every class", "[mlp]") {
  mlp m(mlp_config{});
  std::vector<int> counts(10, 0);
  std::vector<float> x;
  std::vector<int> y;
  for (uint64_t s = 0; s < 20; ++s) {
    m.make_batch(s, 0, 1, x, y);
    for (int l : y) counts[l]++;
  }
  for (int c : counts) CHECK(c > 0);
}

TEST_CASE("mlp: gradient matches finite differences of the loss", "[mlp]") {
  auto cfg = tiny_config();
  mlp m(cfg);
  m.compute_gradients(3, 0, 1);
  std::vector<float> grad(m.grad_data(), m.grad_data() + m.grad_size());
  auto ts = m.tensors();
  // Every parameter (the gradient buffer is laid out in tensors() order).
  // A probe whose perturbation moves some hidden unit across the ReLU kink
  // gets a wrong finite difference, so allow a few mismatches (1 of 400
  // here), but any systematic error fails.
  size_t off = 0, probes = 0, mismatches = 0;
  std::string report;
  for (int t = 0; t < 6; ++t) {
    float* p = static_cast<float*>(ts[t].data);
    const size_t n = ts[t].numel();
    for (size_t e = 0; e < n; ++e) {
      const float saved = p[e];
      const float eps = 1e-3f;
      p[e] = saved + eps;
      const double up = m.compute_gradients(3, 0, 1);
      p[e] = saved - eps;
      const double down = m.compute_gradients(3, 0, 1);
      p[e] = saved;
      const double fd = (up - down) / (2 * eps);
      ++probes;
      if (std::fabs(fd - grad[off + e]) > 1e-3 + 0.02 * std::fabs(fd)) {
        ++mismatches;
        report += ts[t].name + "[" + std::to_string(e) + "]: analytic " + std::to_string(grad[off + e]) + ", numeric " +
                  std::to_string(fd) + "\n";
      }
    }
    off += n;
  }
  CHECK(probes == m.parameter_count());
  INFO("finite-difference mismatches:\n" << report);
  CHECK(mismatches * 50 <= probes);
}

TEST_CASE("mlp: local gradients of 4 workers sum to the single-worker gradient", "[mlp]") {
  auto cfg = tiny_config();
  mlp whole(cfg), part(cfg);
  const float loss = whole.compute_gradients(2, 0, 1);
  std::vector<double> sum(part.grad_size(), 0.0);
  double loss_sum = 0;
  for (int r = 0; r < 4; ++r) {
    loss_sum += part.compute_gradients(2, r, 4);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part.grad_data()[i];
  }
  CHECK(loss_sum == Approx(loss).epsilon(1e-5));
  for (size_t i = 0; i < sum.size(); ++i) CHECK(sum[i] == Approx(whole.grad_data()[i]).margin(1e-5));
}

TEST_CASE("mlp: loss decreases over 200 steps on one worker", "[mlp]") {
  mlp m(mlp_config{});
  std::vector<float> losses;
  for (uint64_t s = 0; s < 200; ++s) {
    losses.push_back(m.compute_gradients(s, 0, 1));
    m.apply_gradients();
  }
  double first = 0, last = 0;
  for (int i = 0; i < 10; ++i) {
    first += losses[i];
    last += losses[190 + i];
  }
  first /= 10;
  last /= 10;
  INFO("mean loss, first 10 steps " << first << ", last 10 steps " << last);
  CHECK(std::isfinite(last));
  CHECK(last < 0.6 * first);
}

TEST_CASE("mlp: training is bit-identical across runs", "[mlp]") {
  auto run = [] {
    mlp m(tiny_config());
    for (uint64_t s = 0; s < 30; ++s) {
      m.compute_gradients(s, 0, 1);
      m.apply_gradients();
    }
    return m.weights_checksum();
  };
  const uint64_t a = run();
  CHECK(a == run());
  CHECK(a != mlp(tiny_config()).weights_checksum());
}

TEST_CASE("mlp: compute_gradients leaves parameters untouched", "[mlp]") {
  mlp m(tiny_config());
  const uint64_t before = m.weights_checksum();
  m.compute_gradients(0, 1, 2);
  CHECK(m.weights_checksum() == before);
}
