// One cached decoder step (one new token in each row) over every layer, as
// xattn/model/net/whisper.py's TextDecoder computes it: the same ATen ops in the same order, so the
// numbers are bitwise the Python path's, without its per-op Python and module calls (~0.7 ms
// of a tiny.en step on 2 cores). The rows are those of one or more caches, as a KVCache or a
// CacheBatch holds them. The layer maps take the plain product (at::linear), split_linear's
// (xattn/model/net/linear.py) or the packed one below, as the CPU's StepKernels say; a step whose
// maps take oneDNN's kernel stays on the Python path (xattn/model/net/fused.py decides).
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

using at::Tensor;

// --- the packed product: x @ Wᵀ + b for a few rows, W read once for all of them -------------
// W [N, K] is copied once into column blocks of 32 (`pack`: [N/32, K, 32], zero-padded), so
// that a block is one contiguous stream and its 32 sums of every row stay in registers while
// the block streams by; the threads take blocks. MKL's and oneDNN's products for 2 to 8 rows
// read W at a fraction of the memory speed on our hosts; this reads it at about that speed,
// with each sum taken over K in order (fp32, fused multiply-adds).
constexpr int64_t kBlock = 32;

Tensor pack(const Tensor& w) {
  const int64_t n = w.size(0), k = w.size(1), blocks = (n + kBlock - 1) / kBlock;
  auto padded = at::zeros({blocks * kBlock, k}, w.options());
  padded.narrow(0, 0, n).copy_(w);
  return padded.view({blocks, kBlock, k}).transpose(1, 2).contiguous();  // [N/32, K, 32]
}

// R rows of x (row stride ldx) times one packed block w [K, 32] -> out [R, 32], in vectors of
// LANES floats (AVX-512: 16, AVX2: 8; elsewhere 4, as the compiler lowers them), two vectors
// of columns a pass over K: the R x 2 sums stay in registers (R up to 8 with AVX-512's 32
// registers, 6 with 16). A second pass reads the cache lines the first one brought in. The
// loops over rows are unrolled: left as loops, GCC kept the sums on the stack (a load and a
// store around every multiply-add; 5 rows 1.4x, 8 rows 1.7x slower from cache).
// Prefetching 64 rows of the block ahead (8 KB) into L2 (prefetcht1) read W 8-10 % faster
// for 5 and 8 rows than 32 rows ahead into L1, from memory and from cache alike.
#define XATTN_BLOCK_KERNEL(NAME, LANES)                                                    \
  template <int R>                                                                         \
  static void NAME(const float* x, int64_t ldx, const float* w, int64_t k, float* out) {   \
    typedef float vec __attribute__((vector_size(LANES * 4), aligned(4)));                 \
    for (int c = 0; c < kBlock; c += 2 * LANES) {                                          \
      vec acc[R][2];                                                                       \
      _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = vec{};   \
      for (int64_t i = 0; i < k; ++i) {                                                    \
        const float* row = w + i * kBlock + c;                                             \
        __builtin_prefetch(row + 64 * kBlock, 0, 2);                                       \
        if (LANES == 16) __builtin_prefetch(row + 64 * kBlock + 16, 0, 2);                 \
        const vec w0 = *reinterpret_cast<const vec*>(row);                                 \
        const vec w1 = *reinterpret_cast<const vec*>(row + LANES);                         \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {                              \
          const float xv = x[r * ldx + i];                                                 \
          acc[r][0] += xv * w0;                                                            \
          acc[r][1] += xv * w1;                                                            \
        }                                                                                  \
      }                                                                                    \
      _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {                                \
        *reinterpret_cast<vec*>(out + r * kBlock + c) = acc[r][0];                         \
        *reinterpret_cast<vec*>(out + r * kBlock + c + LANES) = acc[r][1];                 \
      }                                                                                    \
    }                                                                                      \
  }

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,fma")
XATTN_BLOCK_KERNEL(block512, 16)
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma")
XATTN_BLOCK_KERNEL(block256, 8)
#pragma GCC pop_options
#endif
XATTN_BLOCK_KERNEL(block128, 4)

using BlockFn = void (*)(const float*, int64_t, const float*, int64_t, float*);

// The block kernels this CPU runs, for 1, 2, ... rows at a time: as many rows as its vector
// registers hold sums for. XATTN_PACKED_ISA=avx2 or generic takes a narrower one (tests).
static const std::vector<BlockFn>& block_kernels() {
  static const std::vector<BlockFn> k128{block128<1>, block128<2>, block128<3>,
                                         block128<4>, block128<5>, block128<6>};
#if defined(__x86_64__)
  static const std::vector<BlockFn> k512{block512<1>, block512<2>, block512<3>, block512<4>,
                                         block512<5>, block512<6>, block512<7>, block512<8>};
  static const std::vector<BlockFn> k256{block256<1>, block256<2>, block256<3>,
                                         block256<4>, block256<5>, block256<6>};
  static const std::vector<BlockFn>* chosen = [] {
    const char* isa = std::getenv("XATTN_PACKED_ISA");
    const std::string want = isa ? isa : "";
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (want != "avx2" && want != "generic" && __builtin_cpu_supports("avx512f")) return &k512;
    if (want != "generic" && avx2) return &k256;
    return &k128;
  }();
  return *chosen;
#else
  return k128;
#endif
}

// x [..., K] @ Wᵀ + b through W's `pack`ed copy: [..., N].
Tensor packed_linear(const Tensor& input, const Tensor& packed, const c10::optional<Tensor>& bias,
                     int64_t n) {
  TORCH_CHECK(input.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat, "fp32");
  const auto x = input.contiguous();
  const int64_t k = packed.size(1), rows = x.numel() / k, blocks = packed.size(0);
  TORCH_CHECK(x.size(-1) == k && blocks * kBlock >= n, "shapes");
  auto shape = x.sizes().vec();
  shape.back() = n;
  auto y = at::empty(shape, x.options());
  const float* b = bias && bias->defined() ? bias->data_ptr<float>() : nullptr;
  const float* xp = x.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const auto& kernels = block_kernels();
  const int64_t group = static_cast<int64_t>(kernels.size());
  at::parallel_for(0, blocks, 4, [&](int64_t first, int64_t last) {
    alignas(64) float out[8 * kBlock];
    for (int64_t j = first; j < last; ++j) {
      const int64_t cols = std::min(kBlock, n - j * kBlock);
      for (int64_t r0 = 0; r0 < rows; r0 += group) {
        const int64_t g = std::min(group, rows - r0);
        kernels[g - 1](xp + r0 * k, k, wp + j * k * kBlock, k, out);
        for (int64_t r = 0; r < g; ++r) {
          float* dst = yp + (r0 + r) * n + j * kBlock;
          for (int64_t c = 0; c < cols; ++c) {
            dst[c] = out[r * kBlock + c] + (b ? b[j * kBlock + c] : 0.f);
          }
        }
      }
    }
  });
  return y;
}

// The product a step's layer maps take (StepKernels, xattn/model/net/linear.py): the plain one
// (at::linear), split_linear's (into `blocks` row blocks of W, SPLIT, for up to `max_rows`
// rows, SPLIT_ROWS; Python passes its constants) or the packed one (over `packed` copies).
enum class Product { plain = 0, split = 1, packed = 2 };
struct Kernel {
  Product product;
  int64_t blocks, max_rows;
};

// x @ Wᵀ + b by the kernel's product (at::linear where split_linear does not apply, as there);
// pw: W's packed copy.
static Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& pw,
                     const Kernel& kernel) {
  if (kernel.product == Product::packed) return packed_linear(x, pw, b, w.size(0));
  const int64_t out = w.size(0), in = w.size(1), rows = x.numel() / in, s = kernel.blocks;
  if (kernel.product == Product::plain || rows > kernel.max_rows || out % s ||
      !w.is_contiguous()) {
    return at::linear(x, w, b);
  }
  auto blocks = w.view({s, out / s, in});                            // [S, out/S, in]
  auto cols = x.contiguous().as_strided({s, in, rows}, {0, 1, in});  // [S, in, R]
  auto y = at::baddbmm(b.view({s, out / s, 1}), blocks, cols);       // [S, out/S, R]
  auto shape = x.sizes().vec();
  shape.back() = out;
  return rows == 1 ? y.view(shape) : y.view({out, rows}).t().reshape(shape);
}

// A run of batch rows [start, stop) attending over one tensor pair of cross K/V
// (kv_cache.joined_rows): a cache's own, or those of one-row caches whose K/V are consecutive
// rows of one tensor, joined as one view.
struct Run {
  Tensor k, v;
  int64_t start, stop;
};

static bool follows_rows(const Tensor& a, const Tensor& b) {
  return a.storage().data() == b.storage().data() && a.strides() == b.strides() &&
         b.storage_offset() == a.storage_offset() + a.size(0) * a.stride(0);
}

static Tensor first_rows(const Tensor& t, int64_t n) {
  auto shape = t.sizes().vec();
  shape[0] = n;
  return t.as_strided(shape, t.strides(), t.storage_offset());
}

// kv_cache.joined_rows for one layer: k[i], v[i] serve batch rows starts[i]..starts[i + 1].
static std::vector<Run> joined_rows(const std::vector<Tensor>& k, const std::vector<Tensor>& v,
                                    const std::vector<int64_t>& starts) {
  std::vector<Run> runs;
  for (size_t i = 0; i < k.size(); ++i) {
    const int64_t start = starts[i], stop = starts[i + 1];
    if (!runs.empty() && stop - start == 1) {
      Run& last = runs.back();
      if (last.stop - last.start == last.k.size(0) && k[i].size(0) == 1 &&
          follows_rows(last.k, k[i]) && follows_rows(last.v, v[i])) {
        const int64_t n = last.k.size(0) + 1;
        last = {first_rows(last.k, n), first_rows(last.v, n), last.start, stop};
        continue;
      }
    }
    runs.push_back({k[i], v[i], start, stop});
  }
  return runs;
}

// whisper.attend: queries q [B, H, 1, d_k] over keys kt [B or 1, H, d_k, F] and values
// v [B or 1, H, F, d_k]; 1 with B > 1: the rows as queries of one batch (beams of a window).
static std::pair<Tensor, Tensor> attend(Tensor q, const Tensor& kt, const Tensor& v) {
  const int64_t b = q.size(0), h = q.size(1), d_k = q.size(3);
  const bool shared = b > 1 && kt.size(0) == 1;
  if (shared) q = q.transpose(0, 1).reshape({1, h, b, d_k});  // rows as queries
  auto scores = at::matmul(q, kt).div(std::sqrt(static_cast<double>(d_k)));
  auto y = at::matmul(scores.softmax(-1), v);  // [B, H, 1, d_k] or [1, H, B, d_k]
  if (shared) {
    y = y.reshape({h, b, 1, d_k}).transpose(0, 1);
    scores = scores.reshape({h, b, 1, -1}).transpose(0, 1);
  }
  return {y, scores};
}

static Tensor joined(const std::vector<Tensor>& parts) {
  return parts.size() == 1 ? parts[0] : at::cat(parts);
}

// whisper.joined_scores: rows of windows of fewer frames (a live step's short window) padded
// with -inf to the widest, which their softmax turns into zero weight.
static Tensor joined_scores(std::vector<Tensor> parts) {
  int64_t widest = 0;
  for (const Tensor& p : parts) widest = std::max(widest, p.size(-1));
  for (Tensor& p : parts) {
    if (p.size(-1) != widest)
      p = at::constant_pad_nd(p, {0, widest - p.size(-1)}, -std::numeric_limits<double>::infinity());
  }
  return joined(parts);
}

// x [B, 1, d]: the token embeddings plus positions. weights: per layer, in this order,
// attn_ln w b, qkv w b, attn out w b, cross_ln w b, query w b, cross out w b, mlp_ln w b,
// fc1 w b, fc2 w b (18). The caches, in batch order: self_k[c], self_v[c]
// [L, rows, H, n_ctx, d_k] with lengths[c] rows filled (this step's K/V go to that row);
// cross_k[l * C + c] [1 or rows, H, d_k, F], cross_v[l * C + c] [1 or rows, H, F, d_k]
// (1 with several rows: they attend over one window, as beams do). Returns the states
// [B, 1, d] before the final LayerNorm, then each layer's pre-softmax cross-attention scores
// [B, H, 1, F] when `need_scores`. `product`: the layer maps' (Product; split_linear's of
// `split_blocks` blocks, up to `split_rows` rows); `packed`: for the packed product, each
// layer's six maps packed (qkv, attention out, query, cross out, fc1, fc2).
std::vector<Tensor> decoder_step(Tensor x, const std::vector<Tensor>& weights,
                                 const std::vector<Tensor>& self_k,
                                 const std::vector<Tensor>& self_v,
                                 const std::vector<int64_t>& lengths,
                                 const std::vector<Tensor>& cross_k,
                                 const std::vector<Tensor>& cross_v, int64_t n_head,
                                 bool need_scores, int64_t product, int64_t split_blocks,
                                 int64_t split_rows, const std::vector<Tensor>& packed) {
  c10::InferenceMode guard;
  const Kernel kernel{static_cast<Product>(product), split_blocks, split_rows};
  TORCH_CHECK(kernel.product != Product::packed || packed.size() == 6 * weights.size() / 18,
              "six packed maps a layer");
  const int64_t b = x.size(0), d = x.size(-1), d_k = d / n_head;
  const size_t caches = self_k.size();
  const int64_t layers = static_cast<int64_t>(cross_k.size() / caches);
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == 18 * layers, "18 weights a layer");
  std::vector<int64_t> starts{0};
  for (const auto& k : self_k) starts.push_back(starts.back() + k.size(1));
  TORCH_CHECK(starts.back() == b, "the caches' rows are the batch's");
  std::vector<Tensor> out{Tensor()};
  for (int64_t l = 0; l < layers; ++l) {
    const Tensor* w = &weights[18 * l];
    const Tensor* pw = packed.empty() ? nullptr : &packed[6 * l];
    auto map = [&](const Tensor& in, int i) {  // the layer's i-th map (of six)
      static const int at_[] = {2, 4, 8, 10, 14, 16};
      return linear(in, w[at_[i]], w[at_[i] + 1], pw ? pw[i] : Tensor(), kernel);
    };
    // self-attention, each cache's rows over their own past (SelfAttention.forward, t == 1)
    auto qkv = map(at::layer_norm(x, {d}, w[0], w[1]), 0).chunk(3, -1);
    auto heads = [&](const Tensor& t) { return t.view({b, 1, n_head, d_k}).transpose(1, 2); };
    auto q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);  // [B, H, 1, d_k]
    std::vector<Tensor> ys;
    for (size_t c = 0; c < caches; ++c) {
      const int64_t n = lengths[c], r0 = starts[c], r1 = starts[c + 1];
      auto keys = self_k[c].select(0, l), values = self_v[c].select(0, l);  // [R, H, n_ctx, d_k]
      keys.narrow(2, n, 1).copy_(k.slice(0, r0, r1));
      values.narrow(2, n, 1).copy_(v.slice(0, r0, r1));
      ys.push_back(at::scaled_dot_product_attention(q.slice(0, r0, r1), keys.narrow(2, 0, n + 1),
                                                    values.narrow(2, 0, n + 1)));
    }
    x = x + map(joined(ys).transpose(1, 2).reshape({b, 1, d}), 1);
    // cross-attention (CrossAttention.forward and attend), run by run
    q = heads(map(at::layer_norm(x, {d}, w[6], w[7]), 2));  // [B, H, 1, d_k]
    std::vector<Tensor> layer_k(cross_k.begin() + l * caches, cross_k.begin() + (l + 1) * caches);
    std::vector<Tensor> layer_v(cross_v.begin() + l * caches, cross_v.begin() + (l + 1) * caches);
    std::vector<Tensor> parts, scores;
    for (const Run& run : joined_rows(layer_k, layer_v, starts)) {
      auto [y, s] = attend(q.slice(0, run.start, run.stop), run.k, run.v);
      parts.push_back(y);
      scores.push_back(s);
    }
    x = x + map(joined(parts).transpose(1, 2).reshape({b, 1, d}), 3);
    // MLP
    auto h = map(at::layer_norm(x, {d}, w[12], w[13]), 4);
    x = x + map(at::gelu(h), 5);
    if (need_scores) out.push_back(joined_scores(scores));
  }
  out[0] = x;
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // without the GIL while it runs (as torch's own ops): the server's other threads go on
  m.def("decoder_step", &decoder_step, "one cached decoder step over every layer",
        py::call_guard<py::gil_scoped_release>());
  m.def("pack", &pack, "W [N, K] in column blocks for packed_linear");
  m.def("packed_linear", &packed_linear, "x @ W.T + b over W's packed copy",
        py::call_guard<py::gil_scoped_release>());
}
