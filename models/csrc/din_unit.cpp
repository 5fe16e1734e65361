// DIN's local activation unit with Dice activations and sum pooling, training mode, fused for CPUs.
//
// The unit runs on every behaviour of the batch (M rows, tens of thousands) through narrow layers
// (80, 40). Written as PyTorch ops, each layer and each Dice is several passes over an M×H tensor
// that does not fit in cache (≈ 6 per Dice forward, ≈ 10 backward), so a step is bound by memory
// traffic, not arithmetic. Here the rows are cut into chunks that stay in L2: per chunk, the first
// layer, each activation, the next layer's matmul, the statistics and the pooling happen together,
// and activations are recomputed from the stored pre-activations instead of being stored. Batch
// statistics need every row before any row can be normalised, so each layer still costs one pass
// for statistics and one to apply them.
//
// Inputs (the model computes the per-sample part and the weight split, see DIN.interest_jagged):
//   hist (M, D)      the batch's real behaviours' embeddings
//   rows (M,) int64  the sample of each behaviour, sorted ascending (as nonzero() returns them)
//   query (B, D)     the candidates' embeddings
//   P (B, H0)        the first layer's per-sample term: query·(Wq+Wd)ᵀ + bias
//   Wcat (H0, 2D)    [Wh−Wd | Wp]: the first layer applied to [h, q⊙h]
//   W[l] (H_{l+1}, H_l), b[l]  the hidden layers; w_out (H_last), b_out (1) → one weight per behaviour
//   alpha[l] (H_l)   Dice slopes
// z_0 = P[rows] + [h, q⊙h]·Wcatᵀ; y_l = dice(z_l) = z·(α + p·(1−α)), p = sigmoid((z − mean)·invstd) with
// batch statistics over the M rows (biased variance); z_{l+1} = y_l·W[l]ᵀ + b[l];
// w = y_last·w_out + b_out; pooled[s] = Σ_{rows == s} w·h.
//
// Deterministic: chunk boundaries depend only on M, partial sums are per chunk and reduced in chunk
// order, so results do not depend on the thread count or on scheduling.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

namespace {

constexpr int64_t kRows = 512;  // rows per chunk: a chunk's buffers ((512 × 80) floats ≈ 160 KB each) stay in L2

int64_t n_chunks(int64_t m) { return (m + kRows - 1) / kRows; }

inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }

float* f32(const at::Tensor& t) { return t.data_ptr<float>(); }

void check_f32(const at::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() == dim,
              "din_unit: ", name, " must be a contiguous ", dim, "-d float32 CPU tensor");
}

struct Norm {  // one Dice layer's batch statistics and slope
  const float* mean;
  const float* invstd;
  const float* alpha;
  int64_t h;
};

Norm norm_of(const at::Tensor& mean, const at::Tensor& invstd, const at::Tensor& alpha) {
  return {f32(mean), f32(invstd), f32(alpha), mean.size(0)};
}

// y = dice(z) for r rows
void dice_rows(const float* z, float* y, int64_t r, const Norm& n) {
  for (int64_t i = 0; i < r; ++i) {
    const float* zi = z + i * n.h;
    float* yi = y + i * n.h;
#pragma omp simd
    for (int64_t c = 0; c < n.h; ++c) {
      const float p = sigmoid((zi[c] - n.mean[c]) * n.invstd[c]);
      yi[c] = zi[c] * (n.alpha[c] + p * (1.f - n.alpha[c]));
    }
  }
}

// per-channel Σz and Σz² of r rows, added to sums[0:h] and sums[h:2h]
void add_moments(const float* z, int64_t r, int64_t h, double* sums) {
  for (int64_t i = 0; i < r; ++i) {
    const float* zi = z + i * h;
#pragma omp simd
    for (int64_t c = 0; c < h; ++c) {
      sums[c] += zi[c];
      sums[h + c] += static_cast<double>(zi[c]) * zi[c];
    }
  }
}

// per-chunk moments (C, 2, h) → mean, biased var, invstd (each (h,) float)
void finish_moments(const at::Tensor& partial, int64_t m, double eps, at::Tensor& mean, at::Tensor& var,
                    at::Tensor& invstd) {
  const int64_t chunks = partial.size(0), h = partial.size(2);
  const double* p = partial.data_ptr<double>();
  mean = at::empty({h}, at::kFloat);
  var = at::empty({h}, at::kFloat);
  invstd = at::empty({h}, at::kFloat);
  for (int64_t c = 0; c < h; ++c) {
    double s = 0, s2 = 0;
    for (int64_t k = 0; k < chunks; ++k) {  // chunk order: deterministic
      s += p[k * 2 * h + c];
      s2 += p[k * 2 * h + h + c];
    }
    const double mu = s / m, v = std::max(s2 / m - mu * mu, 0.0);
    f32(mean)[c] = static_cast<float>(mu);
    f32(var)[c] = static_cast<float>(v);
    f32(invstd)[c] = static_cast<float>(1.0 / std::sqrt(v + eps));
  }
}

// Per-sample sums of per-row vectors, out (B, width), for sorted rows. A chunk owns the samples strictly
// inside its range of rows (all their rows are in the chunk); its first and last samples may be shared
// with neighbouring chunks, so their sums go to per-chunk slots added afterwards in chunk order.
class SegmentSum {
 public:
  SegmentSum(const int64_t* rows, int64_t m, int64_t b, int64_t width)
      : rows_(rows), m_(m), width_(width), out_(at::zeros({b, width}, at::kFloat)),
        edges_(at::zeros({n_chunks(m), 2, width}, at::kFloat)), out_p_(f32(out_)), edges_p_(f32(edges_)) {}

  float* slot(int64_t chunk, int64_t row) const {  // where row's contribution goes
    const int64_t s = rows_[row];
    if (s == first(chunk)) return edges_p_ + chunk * 2 * width_;
    if (s == last(chunk)) return edges_p_ + (chunk * 2 + 1) * width_;
    return out_p_ + s * width_;
  }

  at::Tensor finish() {
    for (int64_t c = 0; c < n_chunks(m_); ++c) {
      float* o_first = f32(out_) + first(c) * width_;
      float* o_last = f32(out_) + last(c) * width_;
      const float* e = f32(edges_) + c * 2 * width_;
      for (int64_t k = 0; k < width_; ++k) o_first[k] += e[k];
      for (int64_t k = 0; k < width_; ++k) o_last[k] += e[width_ + k];  // zeros when first == last
    }
    return out_;
  }

 private:
  int64_t first(int64_t c) const { return rows_[c * kRows]; }
  int64_t last(int64_t c) const { return rows_[std::min((c + 1) * kRows, m_) - 1]; }
  const int64_t* rows_;
  int64_t m_, width_;
  at::Tensor out_, edges_;
  float *out_p_, *edges_p_;
};

// Adds one row's terms of a Dice layer's backward sums to s (4h+1 values): Σ ĝ and Σ ĝ·x̂ (batch-norm
// backward), Σ g·z·(1−p) (α's gradient), Σ g_w·dice(z) and Σ g_w (w_out's and b_out's gradients on the
// last layer; g_w = 0 elsewhere), where g is the row's upstream gradient and ĝ = g·z·(1−α)·p·(1−p).
inline void add_backward_sums(const float* z, const float* g, float g_w, const Norm& n, double* s) {
  const int64_t h = n.h;
#pragma omp simd
  for (int64_t k = 0; k < h; ++k) {
    const float a = n.alpha[k];
    const float xh = (z[k] - n.mean[k]) * n.invstd[k], p = sigmoid(xh);
    const float gxh = g[k] * z[k] * (1.f - a) * p * (1.f - p);
    s[k] += gxh;
    s[h + k] += gxh * xh;
    s[2 * h + k] += g[k] * z[k] * (1.f - p);
    s[3 * h + k] += g_w * z[k] * (a + p * (1.f - a));
  }
  s[4 * h] += g_w;
}

// x = [h, q⊙h] for the chunk's rows, (r, 2D)
void first_layer_input(const float* hist, const int64_t* rows, const float* query, int64_t r0, int64_t r,
                       int64_t d, float* x) {
  for (int64_t i = 0; i < r; ++i) {
    const float* h = hist + (r0 + i) * d;
    const float* q = query + rows[r0 + i] * d;
    float* xi = x + i * 2 * d;
#pragma omp simd
    for (int64_t k = 0; k < d; ++k) {
      xi[k] = h[k];
      xi[d + k] = q[k] * h[k];
    }
  }
}

void check_rows(const at::Tensor& rows, int64_t m, int64_t b) {
  TORCH_CHECK(rows.device().is_cpu() && rows.scalar_type() == at::kLong && rows.is_contiguous() &&
                  rows.dim() == 1 && rows.size(0) == m,
              "din_unit: rows must be a contiguous int64 CPU tensor with one entry per behaviour");
  const int64_t* r = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < m; ++i)
    TORCH_CHECK(r[i] >= 0 && r[i] < b && (i == 0 || r[i - 1] <= r[i]),
                "din_unit: rows must be sorted sample indices in [0, B)");
}

// Returns [pooled (B, D), w (M,), z_0 … z_{n-1}, mean_0 …, var_0 …, invstd_0 …].
std::vector<at::Tensor> din_unit_forward(const at::Tensor& hist, const at::Tensor& rows, const at::Tensor& query,
                                         const at::Tensor& P, const at::Tensor& Wcat, at::TensorList W,
                                         at::TensorList b, const at::Tensor& w_out, const at::Tensor& b_out,
                                         at::TensorList alpha, double eps) {
  const int64_t n = static_cast<int64_t>(alpha.size());
  TORCH_CHECK(n >= 1 && static_cast<int64_t>(W.size()) == n - 1 && static_cast<int64_t>(b.size()) == n - 1,
              "din_unit: need one alpha per layer and one (W, b) between consecutive layers");
  check_f32(hist, "hist", 2);
  check_f32(query, "query", 2);
  check_f32(P, "P", 2);
  check_f32(Wcat, "Wcat", 2);
  check_f32(w_out, "w_out", 1);
  const int64_t m = hist.size(0), d = hist.size(1), bsz = query.size(0), h0 = P.size(1), chunks = n_chunks(m);
  TORCH_CHECK(m > 0, "din_unit: no behaviours");
  TORCH_CHECK(query.size(1) == d && P.size(0) == bsz && Wcat.size(0) == h0 && Wcat.size(1) == 2 * d,
              "din_unit: hist, query, P and Wcat shapes do not match");
  check_rows(rows, m, bsz);
  const int64_t* rw = rows.data_ptr<int64_t>();
  const float *hist_p = f32(hist), *query_p = f32(query), *P_p = f32(P);

  // z_0 and its moments
  at::Tensor z0 = at::empty({m, h0}, at::kFloat);
  at::Tensor partial = at::zeros({chunks, 2, h0}, at::kDouble);
  const at::Tensor Wcat_t = Wcat.t();
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    at::Tensor x = at::empty({kRows, 2 * d}, at::kFloat);
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t r0 = c * kRows, r = std::min(kRows, m - r0);
      first_layer_input(hist_p, rw, query_p, r0, r, d, f32(x));
      at::Tensor out = z0.narrow(0, r0, r);
      float* out_p = f32(out);
      for (int64_t i = 0; i < r; ++i) std::copy_n(P_p + rw[r0 + i] * h0, h0, out_p + i * h0);
      out.addmm_(x.narrow(0, 0, r), Wcat_t);
      add_moments(f32(out), r, h0, partial.data_ptr<double>() + c * 2 * h0);
    }
  });

  std::vector<at::Tensor> zs{z0}, means, vars, invstds;
  at::Tensor w = at::empty({m}, at::kFloat);
  at::Tensor pooled;
  for (int64_t l = 0; l < n; ++l) {
    at::Tensor mean, var, invstd;
    finish_moments(partial, m, eps, mean, var, invstd);
    means.push_back(mean);
    vars.push_back(var);
    invstds.push_back(invstd);
    const at::Tensor& z = zs[l];
    const int64_t h = z.size(1);
    check_f32(alpha[l], "alpha", 1);
    TORCH_CHECK(alpha[l].numel() == h, "din_unit: alpha ", l, " has ", alpha[l].numel(), " values for ", h,
                " channels");
    const Norm norm = norm_of(mean, invstd, alpha[l]);
    if (l + 1 < n) {  // z_{l+1} = dice(z_l)·W[l]ᵀ + b[l], and its moments
      check_f32(W[l], "W", 2);
      const int64_t h2 = W[l].size(0);
      TORCH_CHECK(W[l].size(1) == h && b[l].numel() == h2, "din_unit: layer ", l, " shapes do not chain");
      at::Tensor next = at::empty({m, h2}, at::kFloat);
      partial = at::zeros({chunks, 2, h2}, at::kDouble);
      const at::Tensor Wt = W[l].t();
      const float* z_p = f32(z);
      at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
        at::Tensor y = at::empty({kRows, h}, at::kFloat);
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t r0 = c * kRows, r = std::min(kRows, m - r0);
          dice_rows(z_p + r0 * h, f32(y), r, norm);
          at::Tensor out = next.narrow(0, r0, r);
          at::addmm_out(out, b[l], y.narrow(0, 0, r), Wt);
          add_moments(f32(out), r, h2, partial.data_ptr<double>() + c * 2 * h2);
        }
      });
      zs.push_back(next);
    } else {  // w = dice(z_last)·w_out + b_out, pooled[s] += w·h
      TORCH_CHECK(w_out.numel() == h, "din_unit: w_out has ", w_out.numel(), " values for ", h, " channels");
      const float* wo = f32(w_out);
      const float bo = b_out.item<float>();
      SegmentSum pool(rw, m, bsz, d);
      const float* z_p = f32(z);
      float* w_p = f32(w);
      at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
        std::vector<float> y(kRows * h);
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t r0 = c * kRows, r = std::min(kRows, m - r0);
          dice_rows(z_p + r0 * h, y.data(), r, norm);
          for (int64_t i = 0; i < r; ++i) {
            float acc = 0.f;
#pragma omp simd reduction(+ : acc)
            for (int64_t k = 0; k < h; ++k) acc += y[i * h + k] * wo[k];
            const float wi = acc + bo;
            w_p[r0 + i] = wi;
            float* dst = pool.slot(c, r0 + i);
            const float* hi = hist_p + (r0 + i) * d;
#pragma omp simd
            for (int64_t k = 0; k < d; ++k) dst[k] += wi * hi[k];
          }
        }
      });
      pooled = pool.finish();
    }
  }
  std::vector<at::Tensor> out{pooled, w};
  out.insert(out.end(), zs.begin(), zs.end());
  out.insert(out.end(), means.begin(), means.end());
  out.insert(out.end(), vars.begin(), vars.end());
  out.insert(out.end(), invstds.begin(), invstds.end());
  return out;
}

// Returns [g_hist (M, D), g_query (B, D), g_P (B, H0), g_Wcat (H0, 2D), g_W[0] …, g_b[0] …, g_w_out, g_b_out,
// g_alpha_0 …].
std::vector<at::Tensor> din_unit_backward(const at::Tensor& g_pooled, const at::Tensor& hist, const at::Tensor& rows,
                                          const at::Tensor& query, const at::Tensor& Wcat, const at::Tensor& w,
                                          at::TensorList zs, at::TensorList means, at::TensorList invstds,
                                          at::TensorList W, const at::Tensor& w_out, at::TensorList alpha) {
  check_f32(g_pooled, "g_pooled", 2);
  const int64_t n = static_cast<int64_t>(zs.size()), m = hist.size(0), d = hist.size(1), bsz = query.size(0);
  const int64_t h0 = zs[0].size(1), chunks = n_chunks(m);
  const int64_t* rw = rows.data_ptr<int64_t>();
  const float *hist_p = f32(hist), *query_p = f32(query), *gp_p = f32(g_pooled), *w_p = f32(w), *wo_p = f32(w_out);

  // The pooling: g_w[i] = g_pooled[s]·h_i (h_i's own share, w_i·g_pooled[s], is added with the rest below).
  at::Tensor g_w = at::empty({m}, at::kFloat);
  float* gw_p = f32(g_w);
  at::parallel_for(0, m, 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float* gp = gp_p + rw[i] * d;
      const float* hi = hist_p + i * d;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t k = 0; k < d; ++k) acc += gp[k] * hi[k];
      gw_p[i] = acc;
    }
  });

  std::vector<at::Tensor> gW(n - 1), gb(n - 1), galpha(n);
  at::Tensor g_wout, g_bout, g_hist, g_query, g_P, g_Wcat;
  at::Tensor gy;  // upstream gradient of layer l's activation (M, H_l); on the last layer it is g_w ⊗ w_out
  at::Tensor partial;  // per-chunk backward sums of layer l (chunks, 4·H_l + 1), see add_backward_sums
  for (int64_t l = n - 1; l >= 0; --l) {
    const at::Tensor& z = zs[l];
    const int64_t h = z.size(1);
    const bool top = l == n - 1;
    const Norm norm = norm_of(means[l], invstds[l], alpha[l]);
    const float* zp = f32(z);
    const float* gy_p = top ? nullptr : f32(gy);
    auto upstream = [&](int64_t i, float* buf) -> const float* {  // row i's upstream gradient
      if (!top) return gy_p + i * h;
      const float gwi = gw_p[i];
#pragma omp simd
      for (int64_t k = 0; k < h; ++k) buf[k] = gwi * wo_p[k];
      return buf;
    };

    // Pass 1 (the last layer only; the layers below get theirs in the pass above them): per-chunk sums.
    if (top) {
      partial = at::zeros({chunks, 4 * h + 1}, at::kDouble);
      at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
        std::vector<float> buf(h);
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t r0 = c * kRows, r = std::min(kRows, m - r0);
          double* s = partial.data_ptr<double>() + c * (4 * h + 1);
          for (int64_t i = r0; i < r0 + r; ++i) add_backward_sums(zp + i * h, upstream(i, buf.data()), gw_p[i], norm, s);
        }
      });
    }
    at::Tensor sums = partial.sum(0);  // (width,), summed in a fixed order
    const double* S = sums.data_ptr<double>();
    galpha[l] = sums.narrow(0, 2 * h, h).to(at::kFloat);
    if (top) {
      g_wout = sums.narrow(0, 3 * h, h).to(at::kFloat);
      g_bout = sums.narrow(0, 4 * h, 1).to(at::kFloat);
    }
    std::vector<float> mean_gxh(h), mean_gxh_xh(h);
    for (int64_t k = 0; k < h; ++k) {
      mean_gxh[k] = static_cast<float>(S[k] / m);
      mean_gxh_xh[k] = static_cast<float>(S[h + k] / m);
    }

    // Pass 2, per chunk: g_z = g·(α + p(1−α)) + invstd·(ĝ − mean ĝ − x̂·mean(ĝ·x̂)), then the layer below:
    // a hidden layer's weight/bias gradients and upstream gradient, or the first layer's inputs.
    const int64_t hp = l > 0 ? zs[l - 1].size(1) : 2 * d;  // width of what feeds z_l
    at::Tensor g_in_part = at::empty({chunks, h, hp}, at::kFloat);  // per chunk g_zᵀ·input
    at::Tensor gb_part = at::zeros({chunks, h}, at::kDouble);
    at::Tensor gy_prev = l > 0 ? at::empty({m, hp}, at::kFloat) : at::Tensor();
    at::Tensor partial_prev = l > 0 ? at::zeros({chunks, 4 * hp + 1}, at::kDouble) : at::Tensor();
    std::unique_ptr<SegmentSum> seg_P, seg_q;
    float* gh_p = nullptr;
    const float* zprev_p = l > 0 ? f32(zs[l - 1]) : nullptr;
    const Norm prev = l > 0 ? norm_of(means[l - 1], invstds[l - 1], alpha[l - 1]) : Norm{};
    if (l == 0) {
      g_hist = at::empty({m, d}, at::kFloat);
      gh_p = f32(g_hist);
      seg_P = std::make_unique<SegmentSum>(rw, m, bsz, h0);
      seg_q = std::make_unique<SegmentSum>(rw, m, bsz, d);
    }
    at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      at::Tensor gz_buf = at::empty({kRows, h}, at::kFloat);
      at::Tensor in_buf = at::empty({kRows, hp}, at::kFloat);  // the input of z_l, recomputed
      at::Tensor gx_buf = l == 0 ? at::empty({kRows, hp}, at::kFloat) : at::Tensor();  // its gradient (first layer)
      std::vector<float> buf(h);
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t r0 = c * kRows, r = std::min(kRows, m - r0);
        float* gz = f32(gz_buf);
        for (int64_t i = 0; i < r; ++i) {
          const float* zi = zp + (r0 + i) * h;
          const float* g = upstream(r0 + i, buf.data());
          float* gzi = gz + i * h;
#pragma omp simd
          for (int64_t k = 0; k < h; ++k) {
            const float a = norm.alpha[k];
            const float xh = (zi[k] - norm.mean[k]) * norm.invstd[k], p = sigmoid(xh);
            const float gxh = g[k] * zi[k] * (1.f - a) * p * (1.f - p);
            gzi[k] = g[k] * (a + p * (1.f - a)) + norm.invstd[k] * (gxh - mean_gxh[k] - xh * mean_gxh_xh[k]);
          }
        }
        const at::Tensor gz_t = gz_buf.narrow(0, 0, r);
        const at::Tensor in_t = in_buf.narrow(0, 0, r);
        if (l > 0) {
          dice_rows(zprev_p + r0 * hp, f32(in_buf), r, prev);
        } else {
          first_layer_input(hist_p, rw, query_p, r0, r, d, f32(in_buf));
        }
        at::Tensor g_in_c = g_in_part.select(0, c);
        at::mm_out(g_in_c, gz_t.t(), in_t);
        if (l > 0) {
          double* gbc = gb_part.data_ptr<double>() + c * h;
          for (int64_t i = 0; i < r; ++i)
#pragma omp simd
            for (int64_t k = 0; k < h; ++k) gbc[k] += gz[i * h + k];
          at::Tensor gy_c = gy_prev.narrow(0, r0, r);
          at::mm_out(gy_c, gz_t, W[l - 1]);
          // the layer below's pass 1, while its rows are in cache
          double* sp = partial_prev.data_ptr<double>() + c * (4 * hp + 1);
          const float* gyc = f32(gy_c);
          for (int64_t i = 0; i < r; ++i) add_backward_sums(zprev_p + (r0 + i) * hp, gyc + i * hp, 0.f, prev, sp);
          continue;
        }
        // First layer: g_P[s] += g_z; [g_h, g_(q⊙h)] = g_z·Wcat; g_h += g_(q⊙h)·q + w·g_pooled[s];
        // g_q[s] += g_(q⊙h)·h.
        at::Tensor gx_t = gx_buf.narrow(0, 0, r);
        at::mm_out(gx_t, gz_t, Wcat);
        const float* gx_p = f32(gx_buf);
        for (int64_t i = 0; i < r; ++i) {
          const int64_t row = r0 + i, s = rw[row];
          float* dP = seg_P->slot(c, row);
          const float* gzi = gz + i * h;
#pragma omp simd
          for (int64_t k = 0; k < h; ++k) dP[k] += gzi[k];
          const float* gx = gx_p + i * 2 * d;
          const float* q = query_p + s * d;
          const float* hi = hist_p + row * d;
          const float* gp = gp_p + s * d;
          const float wi = w_p[row];
          float* gh = gh_p + row * d;
          float* dq = seg_q->slot(c, row);
#pragma omp simd
          for (int64_t k = 0; k < d; ++k) {
            gh[k] = gx[k] + gx[d + k] * q[k] + wi * gp[k];
            dq[k] += gx[d + k] * hi[k];
          }
        }
      }
    });
    if (l > 0) {
      gW[l - 1] = g_in_part.sum(0);
      gb[l - 1] = gb_part.sum(0).to(at::kFloat);
      gy = gy_prev;
      partial = partial_prev;
    } else {
      g_Wcat = g_in_part.sum(0);
      g_P = seg_P->finish();
      g_query = seg_q->finish();
    }
  }
  std::vector<at::Tensor> out{g_hist, g_query, g_P, g_Wcat};
  out.insert(out.end(), gW.begin(), gW.end());
  out.insert(out.end(), gb.begin(), gb.end());
  out.push_back(g_wout);
  out.push_back(g_bout);
  out.insert(out.end(), galpha.begin(), galpha.end());
  return out;
}

}  // namespace

TORCH_LIBRARY(dinrec, m) {
  m.def("din_unit_forward(Tensor hist, Tensor rows, Tensor query, Tensor P, Tensor Wcat, Tensor[] W, Tensor[] b,"
        " Tensor w_out, Tensor b_out, Tensor[] alpha, float eps) -> Tensor[]");
  m.def("din_unit_backward(Tensor g_pooled, Tensor hist, Tensor rows, Tensor query, Tensor Wcat, Tensor w,"
        " Tensor[] zs, Tensor[] means, Tensor[] invstds, Tensor[] W, Tensor w_out, Tensor[] alpha) -> Tensor[]");
  m.impl("din_unit_forward", c10::DispatchKey::CPU, TORCH_FN(din_unit_forward));
  m.impl("din_unit_backward", c10::DispatchKey::CPU, TORCH_FN(din_unit_backward));
}
