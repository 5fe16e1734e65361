// DIN's activation unit for serving (one history, many candidates), fused, in bfloat16 products.
//
// training/scorer.py computes the same thing as PyTorch ops: two GEMMs that run near the CPU's
// bf16 peak, and between and around them passes over (candidates·L, H) tensors — fp32↔bf16
// copies, the bias adds, PReLU — that cost as much again and miss cache when the service is busy.
// Here each tile of 8 (candidate, behaviour) rows goes through the whole unit in registers and L1:
//
//   p = q_n ⊙ h_l                    (D)   fp32, rounded to bf16
//   z = Wp·p + a[n] + b[l]           (H1)  a: (Wq+Wd)·q_n + bias, per item; b: (Wh−Wd)·h_l, per request
//   x = prelu(z, α1)                 (H1)  rounded to bf16
//   y = prelu(W2·x + b2, α2)         (H2)
//   weight[n, l] = wo·y + bo
//
// Products use AVX-512 BF16 (vdpbf16ps: pairs of bf16 multiplied, summed into fp32 lanes), so the
// weights are packed as pairs along the input dimension: Wp as (D/2, H1, 2), W2 as (H1/2, H2p, 2)
// with H2 padded to a multiple of 16 (zero rows; b2, α2 and wo padded with zeros, so the padding adds
// nothing). Built only for CPUs with AVX-512 BF16 (training/kernels.py checks before loading).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cstdint>

namespace {

constexpr int kMaxD = 256;
constexpr int kMaxH1 = 128;

// acc[t][j] = Σ_k x[t, k]·w[k, j] for T rows of bf16 pairs x (``pairs`` per row, as int32 words) and
// weights packed as (pairs, NB × 16 lanes, 2): per input pair, NB weight vectors against T broadcast
// pairs, so each loaded weight vector serves all T rows. Both layers' products are this.
template <int T, int NB>
inline void bf16_products(const int32_t* x32, int pairs, const __m512i* w, __m512 (&acc)[T][NB]) {
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < NB; ++j) acc[t][j] = _mm512_setzero_ps();
  for (int k = 0; k < pairs; ++k) {
    __m512bh wk[NB];
    for (int j = 0; j < NB; ++j) wk[j] = (__m512bh)_mm512_loadu_si512(w + k * NB + j);
    for (int t = 0; t < T; ++t) {
      __m512bh x = (__m512bh)_mm512_set1_epi32(x32[t * pairs + k]);
      for (int j = 0; j < NB; ++j) acc[t][j] = _mm512_dpbf16_ps(acc[t][j], x, wk[j]);
    }
  }
}

// The first layer and its PReLU for T rows: bf16 rows of x into xbuf (T × H1).
template <int T, int NB1>
inline void first_layer(const float* q, const float* h, int D, const float* a, const float* b, const __m512i* wp,
                        const float* alpha1, uint16_t* xbuf) {
  constexpr int H1 = NB1 * 16;
  alignas(64) uint16_t pbuf[T * kMaxD];
  // p = q ⊙ h, 32 values per conversion.
  for (int t = 0; t < T; ++t) {
    for (int d = 0; d < D; d += 32) {
      __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(h + t * D + d));
      __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(q + d + 16), _mm512_loadu_ps(h + t * D + d + 16));
      _mm512_storeu_si512(reinterpret_cast<__m512i*>(pbuf + t * D + d), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
  __m512 acc[T][NB1];  // z = Wp·p
  bf16_products<T, NB1>(reinterpret_cast<const int32_t*>(pbuf), D / 2, wp, acc);
  // + a + b, PReLU, to bf16 for the next layer.
  const __m512 zero = _mm512_setzero_ps();
  for (int t = 0; t < T; ++t) {
    __m512 z[NB1];
    for (int j = 0; j < NB1; ++j) {
      z[j] = _mm512_add_ps(acc[t][j], _mm512_add_ps(_mm512_loadu_ps(a + 16 * j), _mm512_loadu_ps(b + t * H1 + 16 * j)));
      __mmask16 neg = _mm512_cmp_ps_mask(z[j], zero, _CMP_LT_OQ);
      z[j] = _mm512_mask_mul_ps(z[j], neg, z[j], _mm512_loadu_ps(alpha1 + 16 * j));
    }
    int j = 0;
    for (; j + 1 < NB1; j += 2)
      _mm512_storeu_si512(reinterpret_cast<__m512i*>(xbuf + t * H1 + 16 * j), (__m512i)_mm512_cvtne2ps_pbh(z[j + 1], z[j]));
    if (j < NB1)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xbuf + t * H1 + 16 * j), (__m256i)_mm512_cvtneps_pbh(z[j]));
  }
}

// The hidden layer, its PReLU and the output for T rows of xbuf: one weight per row.
template <int T, int NB1, int NB2>
inline void second_layer(const uint16_t* xbuf, const __m512i* w2, const float* b2, const float* alpha2,
                         const float* wo, float bo, float* out) {
  constexpr int H1 = NB1 * 16;
  __m512 acc[T][NB2];  // W2·x
  bf16_products<T, NB2>(reinterpret_cast<const int32_t*>(xbuf), H1 / 2, w2, acc);
  const __m512 zero = _mm512_setzero_ps();
  for (int t = 0; t < T; ++t) {
    __m512 s = zero;
    for (int j = 0; j < NB2; ++j) {
      __m512 y = _mm512_add_ps(acc[t][j], _mm512_loadu_ps(b2 + 16 * j));
      __mmask16 neg = _mm512_cmp_ps_mask(y, zero, _CMP_LT_OQ);
      y = _mm512_mask_mul_ps(y, neg, y, _mm512_loadu_ps(alpha2 + 16 * j));
      s = _mm512_fmadd_ps(y, _mm512_loadu_ps(wo + 16 * j), s);
    }
    out[t] = _mm512_reduce_add_ps(s) + bo;
  }
}

template <int NB1, int NB2>
void run(const float* q, const float* h, const float* a, const float* b, const __m512i* wp, const __m512i* w2,
         const float* alpha1, const float* b2, const float* alpha2, const float* wo, float bo, float* out, int64_t n,
         int64_t L, int D) {
  constexpr int H1 = NB1 * 16;
  for (int64_t c = 0; c < n; ++c) {
    const float* qc = q + c * D;
    const float* ac = a + c * H1;
    float* oc = out + c * L;
    // Tiles of 8 rows: the first layer in two halves (its 4 × NB1 accumulators fill the registers),
    // the second on all 8 (8 × NB2 accumulators reuse each weight vector 8 times).
    alignas(64) uint16_t xbuf[8 * H1];
    int64_t l = 0;
    for (; l + 8 <= L; l += 8) {
      first_layer<4, NB1>(qc, h + l * D, D, ac, b + l * H1, wp, alpha1, xbuf);
      first_layer<4, NB1>(qc, h + (l + 4) * D, D, ac, b + (l + 4) * H1, wp, alpha1, xbuf + 4 * H1);
      second_layer<8, NB1, NB2>(xbuf, w2, b2, alpha2, wo, bo, oc + l);
    }
    for (; l < L; ++l) {
      first_layer<1, NB1>(qc, h + l * D, D, ac, b + l * H1, wp, alpha1, xbuf);
      second_layer<1, NB1, NB2>(xbuf, w2, b2, alpha2, wo, bo, oc + l);
    }
  }
}

void check(const at::Tensor& t, at::ScalarType dtype, int64_t dim, const char* name) {
  TORCH_CHECK(t.scalar_type() == dtype && t.dim() == dim && t.is_contiguous() && t.device().is_cpu(), name,
              ": expected a contiguous CPU tensor of ", dim, " dims and type ", dtype);
}

// q (N, D) fp32, h (L, D) fp32, a (N, H1), b (L, H1), wp (D/2, H1, 2) bf16, w2 (H1/2, H2p, 2) bf16,
// alpha1 (H1), b2/alpha2/wo (H2p) fp32, bo (1) → weights (N, L) fp32.
at::Tensor unit_weights(const at::Tensor& q, const at::Tensor& h, const at::Tensor& a, const at::Tensor& b,
                        const at::Tensor& wp, const at::Tensor& w2, const at::Tensor& alpha1, const at::Tensor& b2,
                        const at::Tensor& alpha2, const at::Tensor& wo, const at::Tensor& bo) {
  check(q, at::kFloat, 2, "q");
  check(h, at::kFloat, 2, "h");
  check(a, at::kFloat, 2, "a");
  check(b, at::kFloat, 2, "b");
  check(wp, at::kBFloat16, 3, "wp");
  check(w2, at::kBFloat16, 3, "w2");
  const int64_t n = q.size(0), L = h.size(0), D = q.size(1), H1 = a.size(1), H2p = b2.size(0);
  TORCH_CHECK(h.size(1) == D && D % 32 == 0 && D <= kMaxD, "D must match and be a multiple of 32 up to ", kMaxD);
  TORCH_CHECK(a.size(0) == n && b.size(0) == L && b.size(1) == H1 && H1 % 16 == 0 && H1 <= kMaxH1,
              "a (N, H1), b (L, H1), H1 a multiple of 16 up to ", kMaxH1);
  TORCH_CHECK(wp.size(0) == D / 2 && wp.size(1) == H1 && wp.size(2) == 2, "wp must be (D/2, H1, 2)");
  TORCH_CHECK(w2.size(0) == H1 / 2 && w2.size(1) == H2p && w2.size(2) == 2 && H2p % 16 == 0, "w2 must be (H1/2, H2p, 2)");
  TORCH_CHECK(alpha1.numel() == H1 && alpha2.numel() == H2p && wo.numel() == H2p && bo.numel() == 1, "sizes");
  at::Tensor out = at::empty({n, L}, q.options());
  if (n == 0 || L == 0) return out;
  const auto* wpp = reinterpret_cast<const __m512i*>(wp.data_ptr<at::BFloat16>());
  const auto* w2p = reinterpret_cast<const __m512i*>(w2.data_ptr<at::BFloat16>());
  const float bov = bo.item<float>();
#define DINREC_RUN(NB1, NB2)                                                                                        \
  if (H1 == NB1 * 16 && H2p == NB2 * 16) {                                                                          \
    run<NB1, NB2>(q.data_ptr<float>(), h.data_ptr<float>(), a.data_ptr<float>(), b.data_ptr<float>(), wpp, w2p,     \
                  alpha1.data_ptr<float>(), b2.data_ptr<float>(), alpha2.data_ptr<float>(), wo.data_ptr<float>(), \
                  bov, out.data_ptr<float>(), n, L, static_cast<int>(D));                                           \
    return out;                                                                                                     \
  }
  DINREC_RUN(5, 3)  // 80-40, DIN's published unit and dinrec's default
  DINREC_RUN(4, 2)  // 64-32
  DINREC_RUN(2, 1)  // 32-16
  DINREC_RUN(8, 4)  // 128-64
#undef DINREC_RUN
  TORCH_CHECK(false, "no fused unit for H1=", H1, ", H2 (padded)=", H2p, "; supports_unit() should have said so");
}

}  // namespace

TORCH_LIBRARY(dinrec_score, m) {
  m.def("unit_weights(Tensor q, Tensor h, Tensor a, Tensor b, Tensor wp, Tensor w2, Tensor alpha1, Tensor b2,"
        " Tensor alpha2, Tensor wo, Tensor bo) -> Tensor");
}

TORCH_LIBRARY_IMPL(dinrec_score, CPU, m) { m.impl("unit_weights", &unit_weights); }
