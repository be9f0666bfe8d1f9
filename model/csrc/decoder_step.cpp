// One cached decoder step (one new token in each row) over every layer, as
// xattn/model/whisper.py's TextDecoder computes it: the same ATen ops in the same order, so the
// numbers are bitwise the Python path's, without its per-op Python and module calls (~0.7 ms
// of a tiny.en step on 2 cores). The rows are those of one or more caches, as a KVCache or a
// CacheBatch holds them. The layer maps take the plain product (at::linear) or split_linear's
// (xattn/model/linear.py), as the CPU's StepKernels say; a step whose maps take oneDNN's
// kernel stays on the Python path (xattn/model/fused.py decides).
#include <torch/extension.h>

#include <cmath>
#include <vector>

using at::Tensor;

// How split_linear (xattn/model/linear.py) splits: into `blocks` row blocks of W (SPLIT), for
// up to `max_rows` rows (SPLIT_ROWS); Python passes its constants. blocks 0: no split.
struct Split {
  int64_t blocks, max_rows;
};

// x @ Wᵀ + b: at::linear, or as split_linear computes it (one bmm over the row blocks of W;
// at::linear where it does not apply, as there).
static Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, const Split& split) {
  const int64_t out = w.size(0), in = w.size(1), rows = x.numel() / in, s = split.blocks;
  if (s == 0 || rows > split.max_rows || out % s || !w.is_contiguous()) {
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

// x [B, 1, d]: the token embeddings plus positions. weights: per layer, in this order,
// attn_ln w b, qkv w b, attn out w b, cross_ln w b, query w b, cross out w b, mlp_ln w b,
// fc1 w b, fc2 w b (18). The caches, in batch order: self_k[c], self_v[c]
// [L, rows, H, n_ctx, d_k] with lengths[c] rows filled (this step's K/V go to that row);
// cross_k[l * C + c] [1 or rows, H, d_k, F], cross_v[l * C + c] [1 or rows, H, F, d_k]
// (1 with several rows: they attend over one window, as beams do). Returns the states
// [B, 1, d] before the final LayerNorm, then each layer's pre-softmax cross-attention scores
// [B, H, 1, F] when `need_scores`. `split_kernel`: the layer maps take split_linear's product
// (of `split_blocks` blocks, up to `split_rows` rows), else the plain one.
std::vector<Tensor> decoder_step(Tensor x, const std::vector<Tensor>& weights,
                                 const std::vector<Tensor>& self_k,
                                 const std::vector<Tensor>& self_v,
                                 const std::vector<int64_t>& lengths,
                                 const std::vector<Tensor>& cross_k,
                                 const std::vector<Tensor>& cross_v, int64_t n_head,
                                 bool need_scores, bool split_kernel, int64_t split_blocks,
                                 int64_t split_rows) {
  c10::InferenceMode guard;
  const Split split{split_kernel ? split_blocks : 0, split_rows};
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
    // self-attention, each cache's rows over their own past (SelfAttention.forward, t == 1)
    auto qkv = linear(at::layer_norm(x, {d}, w[0], w[1]), w[2], w[3], split).chunk(3, -1);
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
    x = x + linear(joined(ys).transpose(1, 2).reshape({b, 1, d}), w[4], w[5], split);
    // cross-attention (CrossAttention.forward and attend), run by run
    q = heads(linear(at::layer_norm(x, {d}, w[6], w[7]), w[8], w[9], split));  // [B, H, 1, d_k]
    std::vector<Tensor> layer_k(cross_k.begin() + l * caches, cross_k.begin() + (l + 1) * caches);
    std::vector<Tensor> layer_v(cross_v.begin() + l * caches, cross_v.begin() + (l + 1) * caches);
    std::vector<Tensor> parts, scores;
    for (const Run& run : joined_rows(layer_k, layer_v, starts)) {
      auto [y, s] = attend(q.slice(0, run.start, run.stop), run.k, run.v);
      parts.push_back(y);
      scores.push_back(s);
    }
    x = x + linear(joined(parts).transpose(1, 2).reshape({b, 1, d}), w[10], w[11], split);
    // MLP
    auto h = linear(at::layer_norm(x, {d}, w[12], w[13]), w[14], w[15], split);
    x = x + linear(at::gelu(h), w[16], w[17], split);
    if (need_scores) out.push_back(joined(scores));
  }
  out[0] = x;
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // without the GIL while it runs (as torch's own ops): the server's other threads go on
  m.def("decoder_step", &decoder_step, "one cached decoder step over every layer",
        py::call_guard<py::gil_scoped_release>());
}
