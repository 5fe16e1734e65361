// DIN's activation unit over lists of candidates (models.din.DIN.lists_from), fused for CPUs: one
// hidden layer with PReLU, the padded layout, forward and backward.
//
// Per (sample b, candidate n, behaviour l) the unit computes
//     z = a[b,n] + pb[b,l] + Σ_d q[b,n,d]·h[b,l,d]·WpT[d] + Σ_p pf[b,n,l,p]·Wpair[p]      (H values)
//     w[b,n,l] = Σ_k prelu(z_k; α_k)·wout_k + bout      (0 where slot l holds no behaviour)
// a (the candidate's part of the first layer, bias included) and pb (the behaviour's: its own part, its
// position and time-gap terms) are computed once per candidate and once per behaviour by the model;
// only this per-pair part is here. As PyTorch ops it is a dozen passes over a (B, N, L, H) tensor that
// does not fit in cache (a broadcast add, the pair term, PReLU, the out product, and as many backward,
// with reductions for the broadcasts): a step is bound by memory traffic. Here each pair's H values
// live in registers, and the backward recomputes them instead of storing them.
//
// Deterministic: samples are cut into fixed chunks; each chunk's weight gradients are summed apart and
// the chunks reduced in order (in double), so results do not depend on the thread count.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

namespace {

constexpr int64_t kChunk = 4;  // samples per chunk of work (and of partial weight gradients)
constexpr int64_t kMaxH = 256;

float* f32(const at::Tensor& t) { return t.data_ptr<float>(); }

void check(const at::Tensor& t, const char* name, int64_t dim, at::ScalarType type = at::kFloat) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == type && t.is_contiguous() && t.dim() == dim,
              "din_lists: ", name, " must be a contiguous ", dim, "-d CPU tensor of ", type);
}

struct Shapes {
  int64_t B, N, L, D, H, P;
};

// The shapes with H and D known at compile time where they are one of the common ones (kH, kD > 0): the
// inner loops then unroll into a few vector instructions instead of looping with a remainder.
template <int kH, int kD>
struct Dims {
  int64_t B, N, L, D, H, P;
  explicit Dims(const Shapes& s)
      : B(s.B), N(s.N), L(s.L), D(kD > 0 ? kD : s.D), H(kH > 0 ? kH : s.H), P(s.P) {}
};

Shapes shapes(const at::Tensor& q, const at::Tensor& h, const at::Tensor& a, const at::Tensor& pb,
              const at::Tensor& pf, const at::Tensor& filled, const at::Tensor& wpt, const at::Tensor& wpair,
              const at::Tensor& alpha, const at::Tensor& wout, const at::Tensor& bout) {
  check(q, "q", 3);
  check(h, "h", 3);
  check(a, "a", 3);
  check(pb, "pb", 3);
  check(pf, "pf", 4);
  check(filled, "filled", 2, at::kBool);
  check(wpt, "WpT", 2);
  check(wpair, "Wpair", 2);
  check(alpha, "alpha", 1);
  check(wout, "wout", 1);
  check(bout, "bout", 1);
  Shapes s{q.size(0), q.size(1), h.size(1), q.size(2), a.size(2), pf.size(3)};
  TORCH_CHECK(s.H <= kMaxH, "din_lists: at most ", kMaxH, " hidden units");
  TORCH_CHECK(h.size(0) == s.B && h.size(2) == s.D && a.size(0) == s.B && a.size(1) == s.N && pb.size(0) == s.B &&
                  pb.size(1) == s.L && pb.size(2) == s.H && wpt.size(0) == s.D && wpt.size(1) == s.H &&
                  alpha.size(0) == s.H && wout.size(0) == s.H && bout.size(0) == 1 && filled.size(0) == s.B &&
                  filled.size(1) == s.L && wpair.size(0) == s.P && (s.P == 0 || wpair.size(1) == s.H) &&
                  pf.size(0) == s.B && pf.size(1) == s.N && pf.size(2) == s.L,
              "din_lists: inconsistent shapes");
  return s;
}

// Z (Lb × H) for one candidate n against the sample's Lb behaviours listed in ls: a mini-GEMM per
// candidate, Qh (Lb × D) · WpT (D × H) with Qh[l, d] = q_n[d]·h_l[d], plus the per-candidate,
// per-behaviour and pair terms. The inner loops run over k (H, contiguous) with the behaviours as
// independent accumulators, which is what vectorises.
template <int kH, int kD>
void pre_activations(const Shapes& s0, const float* qn, const float* hb, const float* an, const float* pbb,
                     const float* pfn, const float* wpt, const float* wpair, const int64_t* ls, int64_t lb,
                     float* Z, float* Qh) {
  const Dims<kH, kD> s(s0);
  for (int64_t j = 0; j < lb; ++j) {
    const float* hl = hb + ls[j] * s.D;
    float* qhj = Qh + j * s.D;
#pragma omp simd
    for (int64_t d = 0; d < s.D; ++d) qhj[d] = qn[d] * hl[d];
  }
  if constexpr (kH > 0) {
    // Four behaviours at a time: four independent accumulators of kH lanes each (registers, not memory).
    for (int64_t j0 = 0; j0 < lb; j0 += 4) {
      const int64_t m = std::min<int64_t>(4, lb - j0);
      float z[4][kH];
      for (int64_t r = 0; r < 4; ++r) {
        const float* pbl = pbb + ls[j0 + std::min(r, m - 1)] * s.H;
#pragma omp simd
        for (int64_t k = 0; k < kH; ++k) z[r][k] = an[k] + pbl[k];
      }
      for (int64_t d = 0; d < s.D; ++d) {
        const float* row = wpt + d * kH;
        float x[4];
        for (int64_t r = 0; r < 4; ++r) x[r] = Qh[(j0 + std::min(r, m - 1)) * s.D + d];
        for (int64_t r = 0; r < 4; ++r)
#pragma omp simd
          for (int64_t k = 0; k < kH; ++k) z[r][k] += x[r] * row[k];
      }
      for (int64_t p = 0; p < s.P; ++p) {
        const float* row = wpair + p * kH;
        for (int64_t r = 0; r < m; ++r) {
          const float x = pfn[ls[j0 + r] * s.P + p];
#pragma omp simd
          for (int64_t k = 0; k < kH; ++k) z[r][k] += x * row[k];
        }
      }
      for (int64_t r = 0; r < m; ++r) std::copy(z[r], z[r] + kH, Z + (j0 + r) * kH);
    }
    return;
  }
  for (int64_t j = 0; j < lb; ++j) {
    const float* pbl = pbb + ls[j] * s.H;
    float* zj = Z + j * s.H;
#pragma omp simd
    for (int64_t k = 0; k < s.H; ++k) zj[k] = an[k] + pbl[k];
  }
  for (int64_t d = 0; d < s.D; ++d) {
    const float* row = wpt + d * s.H;
    for (int64_t j = 0; j < lb; ++j) {
      const float x = Qh[j * s.D + d];
      float* zj = Z + j * s.H;
#pragma omp simd
      for (int64_t k = 0; k < s.H; ++k) zj[k] += x * row[k];
    }
  }
  for (int64_t p = 0; p < s.P; ++p) {
    const float* row = wpair + p * s.H;
    for (int64_t j = 0; j < lb; ++j) {
      const float x = pfn[ls[j] * s.P + p];
      float* zj = Z + j * s.H;
#pragma omp simd
      for (int64_t k = 0; k < s.H; ++k) zj[k] += x * row[k];
    }
  }
}

// the behaviours a sample holds: their slots in ls, their count returned
int64_t filled_slots(const Shapes& s, const bool* fl, int64_t b, int64_t* ls) {  // NOLINT
  int64_t lb = 0;
  for (int64_t l = 0; l < s.L; ++l)
    if (fl[b * s.L + l]) ls[lb++] = l;
  return lb;
}

template <int kH, int kD>
at::Tensor forward_impl(const Shapes& s0, const at::Tensor& q, const at::Tensor& h, const at::Tensor& a,
                        const at::Tensor& pb, const at::Tensor& pf, const at::Tensor& filled, const at::Tensor& wpt,
                        const at::Tensor& wpair, const at::Tensor& alpha, const at::Tensor& wout,
                        const at::Tensor& bout) {
  const Dims<kH, kD> s(s0);
  at::Tensor w = at::zeros({s.B, s.N, s.L}, q.options());
  const float *qp = f32(q), *hp = f32(h), *ap = f32(a), *pbp = f32(pb), *pfp = f32(pf), *wptp = f32(wpt),
              *wpp = f32(wpair), *al = f32(alpha), *wo = f32(wout);
  const float bo = f32(bout)[0];
  const bool* fl = filled.data_ptr<bool>();
  float* wp = f32(w);
  at::parallel_for(0, s.B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> Z(s.L * s.H), Qh(s.L * s.D);
    std::vector<int64_t> ls(s.L);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t lb = filled_slots(s0, fl, b, ls.data());
      for (int64_t n = 0; n < s.N; ++n) {
        pre_activations<kH, kD>(s0, qp + (b * s.N + n) * s.D, hp + b * s.L * s.D, ap + (b * s.N + n) * s.H,
                        pbp + b * s.L * s.H, pfp + (b * s.N + n) * s.L * s.P, wptp, wpp, ls.data(), lb, Z.data(),
                        Qh.data());
        float* wn = wp + (b * s.N + n) * s.L;
        for (int64_t j = 0; j < lb; ++j) {
          const float* zj = Z.data() + j * s.H;
          float out = bo;
#pragma omp simd reduction(+ : out)
          for (int64_t k = 0; k < s.H; ++k) out += (zj[k] >= 0.f ? zj[k] : al[k] * zj[k]) * wo[k];
          wn[ls[j]] = out;
        }
      }
    }
  });
  return w;
}

template <int kH, int kD>
std::vector<at::Tensor> backward_impl(const Shapes& s0, const at::Tensor& gw, const at::Tensor& q,
                                      const at::Tensor& h, const at::Tensor& a, const at::Tensor& pb,
                                      const at::Tensor& pf, const at::Tensor& filled, const at::Tensor& wpt,
                                      const at::Tensor& wpair, const at::Tensor& alpha, const at::Tensor& wout,
                                      const at::Tensor& bout) {
  const Dims<kH, kD> s(s0);
  at::Tensor g_q = at::zeros_like(q), g_h = at::zeros_like(h), g_a = at::zeros_like(a), g_pb = at::zeros_like(pb);
  const int64_t chunks = (s.B + kChunk - 1) / kChunk;
  // Per chunk: g_WpT (D·H), g_Wpair (P·H), g_alpha (H), g_wout (H), g_bout (1).
  const int64_t width = s.D * s.H + s.P * s.H + 2 * s.H + 1;
  at::Tensor partial = at::zeros({chunks, width}, q.options());
  at::Tensor wp_rows = wpt.t().contiguous();  // (H, D): T = GZ · Wp without horizontal sums
  const float *qp = f32(q), *hp = f32(h), *ap = f32(a), *pbp = f32(pb), *pfp = f32(pf), *wptp = f32(wpt),
              *wpp = f32(wpair), *al = f32(alpha), *wo = f32(wout), *gwp = f32(gw), *wph = f32(wp_rows);
  const bool* fl = filled.data_ptr<bool>();
  float *gqp = f32(g_q), *ghp = f32(g_h), *gap = f32(g_a), *gpbp = f32(g_pb), *partp = f32(partial);
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> Z(s.L * s.H), Qh(s.L * s.D), T(s.L * s.D);
    std::vector<int64_t> ls(s.L);
    for (int64_t c = c0; c < c1; ++c) {
      float* acc = partp + c * width;
      float *g_wpt = acc, *g_wpair = acc + s.D * s.H, *g_alpha = g_wpair + s.P * s.H, *g_wout = g_alpha + s.H,
            *g_bout = g_wout + s.H;
      for (int64_t b = c * kChunk; b < std::min(s.B, (c + 1) * kChunk); ++b) {
        const int64_t lb = filled_slots(s0, fl, b, ls.data());
        const float* hb = hp + b * s.L * s.D;
        for (int64_t n = 0; n < s.N; ++n) {
          const float* qn = qp + (b * s.N + n) * s.D;
          const float* pfn = pfp + (b * s.N + n) * s.L * s.P;
          const float* gwn = gwp + (b * s.N + n) * s.L;
          pre_activations<kH, kD>(s0, qn, hb, ap + (b * s.N + n) * s.H, pbp + b * s.L * s.H, pfn, wptp, wpp,
                                  ls.data(), lb, Z.data(), Qh.data());
          float* gan = gap + (b * s.N + n) * s.H;
          // GZ overwrites Z: dL/dz of each pair
          for (int64_t j = 0; j < lb; ++j) {
            const float g = gwn[ls[j]];
            float* zj = Z.data() + j * s.H;
            float* gpbl = gpbp + (b * s.L + ls[j]) * s.H;
            g_bout[0] += g;
#pragma omp simd
            for (int64_t k = 0; k < s.H; ++k) {
              const float z = zj[k];
              const bool pos = z >= 0.f;
              const float gy = g * wo[k];
              g_wout[k] += g * (pos ? z : al[k] * z);
              g_alpha[k] += pos ? 0.f : gy * z;
              const float gz = pos ? gy : gy * al[k];
              zj[k] = gz;
              gan[k] += gz;
              gpbl[k] += gz;
            }
          }
          // g_WpT (D × H) += Qhᵀ · GZ (four rows of it at a time: independent accumulators); g_Wpair += pfᵀ · GZ
          for (int64_t d0 = 0; d0 < s.D; d0 += 4) {
            const int64_t m = std::min<int64_t>(4, s.D - d0);
            for (int64_t r = 0; r < m; ++r) {
              float* grow = g_wpt + (d0 + r) * s.H;
              for (int64_t j = 0; j < lb; ++j) {
                const float x = Qh[j * s.D + d0 + r];
                const float* gz = Z.data() + j * s.H;
#pragma omp simd
                for (int64_t k = 0; k < s.H; ++k) grow[k] += x * gz[k];
              }
            }
          }
          for (int64_t p = 0; p < s.P; ++p) {
            float* grow = g_wpair + p * s.H;
            for (int64_t j = 0; j < lb; ++j) {
              const float x = pfn[ls[j] * s.P + p];
              const float* gz = Z.data() + j * s.H;
#pragma omp simd
              for (int64_t k = 0; k < s.H; ++k) grow[k] += x * gz[k];
            }
          }
          // T (Lb × D) = GZ · Wp; g_q_n += Σ_l T_l ⊙ h_l; g_h_l += T_l ⊙ q_n
          float* gqn = gqp + (b * s.N + n) * s.D;
          if constexpr (kD > 0) {  // four behaviours at a time, their rows of T in registers
            for (int64_t j0 = 0; j0 < lb; j0 += 4) {
              const int64_t m = std::min<int64_t>(4, lb - j0);
              float t[4][kD] = {};
              for (int64_t k = 0; k < s.H; ++k) {
                const float* row = wph + k * kD;
                float x[4];
                for (int64_t r = 0; r < 4; ++r) x[r] = Z[(j0 + std::min(r, m - 1)) * s.H + k];
                for (int64_t r = 0; r < 4; ++r)
#pragma omp simd
                  for (int64_t d = 0; d < kD; ++d) t[r][d] += x[r] * row[d];
              }
              for (int64_t r = 0; r < m; ++r) std::copy(t[r], t[r] + kD, T.data() + (j0 + r) * kD);
            }
          } else {
            for (int64_t j = 0; j < lb; ++j) {
              float* tj = T.data() + j * s.D;
              const float* gz = Z.data() + j * s.H;
              std::fill(tj, tj + s.D, 0.f);
              for (int64_t k = 0; k < s.H; ++k) {
                const float x = gz[k];
                const float* row = wph + k * s.D;
#pragma omp simd
                for (int64_t d = 0; d < s.D; ++d) tj[d] += x * row[d];
              }
            }
          }
          for (int64_t j = 0; j < lb; ++j) {
            const float* tj = T.data() + j * s.D;
            const float* hl = hb + ls[j] * s.D;
            float* ghl = ghp + (b * s.L + ls[j]) * s.D;
#pragma omp simd
            for (int64_t d = 0; d < s.D; ++d) {
              gqn[d] += tj[d] * hl[d];
              ghl[d] += tj[d] * qn[d];
            }
          }
        }
      }
    }
  });
  at::Tensor total = partial.to(at::kDouble).sum(0).to(at::kFloat);  // chunk order: deterministic
  std::vector<at::Tensor> out{g_q, g_h, g_a, g_pb};
  int64_t off = 0;
  out.push_back(total.narrow(0, off, s.D * s.H).view({s.D, s.H}).clone());
  off += s.D * s.H;
  out.push_back(total.narrow(0, off, s.P * s.H).view({s.P, s.H}).clone());
  off += s.P * s.H;
  out.push_back(total.narrow(0, off, s.H).clone());
  off += s.H;
  out.push_back(total.narrow(0, off, s.H).clone());
  off += s.H;
  out.push_back(total.narrow(0, off, 1).clone());
  return out;
}


// One instantiation per common (H, D); others run the same code with runtime sizes.
#define DINREC_LISTS_DISPATCH(FN, ...)                                                        \
  if (s.H == 16 && s.D == 32) return FN<16, 32>(s, __VA_ARGS__);                              \
  if (s.H == 8 && s.D == 32) return FN<8, 32>(s, __VA_ARGS__);                                \
  if (s.H == 32 && s.D == 32) return FN<32, 32>(s, __VA_ARGS__);                              \
  if (s.H == 16 && s.D == 16) return FN<16, 16>(s, __VA_ARGS__);                              \
  if (s.H == 16 && s.D == 64) return FN<16, 64>(s, __VA_ARGS__);                              \
  return FN<0, 0>(s, __VA_ARGS__);

at::Tensor unit_forward(const at::Tensor& q, const at::Tensor& h, const at::Tensor& a, const at::Tensor& pb,
                        const at::Tensor& pf, const at::Tensor& filled, const at::Tensor& wpt,
                        const at::Tensor& wpair, const at::Tensor& alpha, const at::Tensor& wout,
                        const at::Tensor& bout) {
  const Shapes s = shapes(q, h, a, pb, pf, filled, wpt, wpair, alpha, wout, bout);
  DINREC_LISTS_DISPATCH(forward_impl, q, h, a, pb, pf, filled, wpt, wpair, alpha, wout, bout)
}

std::vector<at::Tensor> unit_backward(const at::Tensor& gw, const at::Tensor& q, const at::Tensor& h,
                                      const at::Tensor& a, const at::Tensor& pb, const at::Tensor& pf,
                                      const at::Tensor& filled, const at::Tensor& wpt, const at::Tensor& wpair,
                                      const at::Tensor& alpha, const at::Tensor& wout, const at::Tensor& bout) {
  const Shapes s = shapes(q, h, a, pb, pf, filled, wpt, wpair, alpha, wout, bout);
  check(gw, "gw", 3);
  DINREC_LISTS_DISPATCH(backward_impl, gw, q, h, a, pb, pf, filled, wpt, wpair, alpha, wout, bout)
}

}  // namespace

TORCH_LIBRARY(dinrec_lists, m) {
  m.def("unit_forward(Tensor q, Tensor h, Tensor a, Tensor pb, Tensor pf, Tensor filled, Tensor wpt, Tensor wpair,"
        " Tensor alpha, Tensor wout, Tensor bout) -> Tensor");
  m.def("unit_backward(Tensor gw, Tensor q, Tensor h, Tensor a, Tensor pb, Tensor pf, Tensor filled, Tensor wpt,"
        " Tensor wpair, Tensor alpha, Tensor wout, Tensor bout) -> Tensor[]");
  m.impl("unit_forward", c10::DispatchKey::CPU, TORCH_FN(unit_forward));
  m.impl("unit_backward", c10::DispatchKey::CPU, TORCH_FN(unit_backward));
}
