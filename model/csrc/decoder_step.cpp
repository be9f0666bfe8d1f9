// One cached decoder step (one new token in each of B rows of a KVCache) over every layer, as
// xattn/model/whisper.py's TextDecoder computes it: the same ATen ops in the same order, so the
// numbers are bitwise the Python path's, without its per-op Python and module calls (~0.7 ms
// of a tiny.en step on 2 cores). The layer maps take the plain product (at::linear) or
// split_linear's (xattn/model/linear.py), as the CPU's StepKernels say; a step whose maps take
// oneDNN's kernel stays on the Python path (xattn/model/fused.py decides).
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

// x [B, 1, d]: the token embeddings plus positions. weights: per layer, in this order,
// attn_ln w b, qkv w b, attn out w b, cross_ln w b, query w b, cross out w b, mlp_ln w b,
// fc1 w b, fc2 w b (18). self_k, self_v [L, B, H, n_ctx, d_k] with `length` rows filled; this
// step's K/V go to row `length`. cross_k [B or 1, H, d_k, F], cross_v [B or 1, H, F, d_k] per
// layer (1: every row attends over the same window, as beams do). Returns the states
// [B, 1, d] before the final LayerNorm, then each layer's pre-softmax cross-attention scores
// [B, H, 1, F] when `need_scores`. `split_kernel`: the layer maps take split_linear's product
// (of `split_blocks` blocks, up to `split_rows` rows), else the plain one.
std::vector<Tensor> decoder_step(Tensor x, const std::vector<Tensor>& weights,
                                 const Tensor& self_k, const Tensor& self_v, int64_t length,
                                 const std::vector<Tensor>& cross_k,
                                 const std::vector<Tensor>& cross_v, int64_t n_head,
                                 bool need_scores, bool split_kernel, int64_t split_blocks,
                                 int64_t split_rows) {
  c10::InferenceMode guard;
  const Split split{split_kernel ? split_blocks : 0, split_rows};
  const int64_t b = x.size(0), d = x.size(-1), d_k = d / n_head;
  const int64_t layers = static_cast<int64_t>(cross_k.size());
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == 18 * layers, "18 weights a layer");
  std::vector<Tensor> out{Tensor()};
  for (int64_t l = 0; l < layers; ++l) {
    const Tensor* w = &weights[18 * l];
    // self-attention over the rows so far (SelfAttention.forward, t == 1)
    auto qkv = linear(at::layer_norm(x, {d}, w[0], w[1]), w[2], w[3], split).chunk(3, -1);
    auto heads = [&](const Tensor& t) { return t.view({b, 1, n_head, d_k}).transpose(1, 2); };
    auto q = heads(qkv[0]);
    auto keys = self_k.select(0, l), values = self_v.select(0, l);  // [B, H, n_ctx, d_k]
    keys.narrow(2, length, 1).copy_(heads(qkv[1]));
    values.narrow(2, length, 1).copy_(heads(qkv[2]));
    auto y = at::scaled_dot_product_attention(q, keys.narrow(2, 0, length + 1),
                                              values.narrow(2, 0, length + 1));
    x = x + linear(y.transpose(1, 2).reshape({b, 1, d}), w[4], w[5], split);
    // cross-attention (CrossAttention.forward and attend)
    q = heads(linear(at::layer_norm(x, {d}, w[6], w[7]), w[8], w[9], split));  // [B, H, 1, d_k]
    const bool shared = b > 1 && cross_k[l].size(0) == 1;
    if (shared) q = q.transpose(0, 1).reshape({1, n_head, b, d_k});  // rows as queries
    auto scores = at::matmul(q, cross_k[l]).div(std::sqrt(static_cast<double>(d_k)));
    y = at::matmul(scores.softmax(-1), cross_v[l]);  // [B, H, 1, d_k] or [1, H, B, d_k]
    if (shared) {
      y = y.reshape({n_head, b, 1, d_k}).transpose(0, 1);
      scores = scores.reshape({n_head, b, 1, -1}).transpose(0, 1);
    }
    x = x + linear(y.transpose(1, 2).reshape({b, 1, d}), w[10], w[11], split);
    // MLP
    auto h = linear(at::layer_norm(x, {d}, w[12], w[13]), w[14], w[15], split);
    x = x + linear(at::gelu(h), w[16], w[17], split);
    if (need_scores) out.push_back(scores);
  }
  out[0] = x;
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // without the GIL while it runs (as torch's own ops): the server's other threads go on
  m.def("decoder_step", &decoder_step, "one cached decoder step over every layer",
        py::call_guard<py::gil_scoped_release>());
}
