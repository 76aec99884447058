// The kernels of `nn`'s device tensors: one launch per op (eager mode), sizes as arguments, so one module
// serves every shape. CPU twins: the host paths of src/nn/*.rs (their math is src/ops/ and cpu::gemm);
// launch layer: src/nn/cuda/.
//
//   elementwise  nn_binary (+ − × ÷ with NumPy broadcasting, the shapes collapsed to four axes by the
//                host), nn_add_relu (a sum and its ReLU, the capture's add → relu), nn_binary_grad (one
//                operand's gradient: each of its elements sums the positions it was broadcast to, in
//                row-major order, as the CPU twin does), nn_scalar, nn_unary and
//                nn_unary_grad (activations.cuh), nn_gather (a strided copy: transpose, permute).
//   reductions   nn_sum_axis (one thread per output, the axis summed from index 0 up; a long axis first in
//                parts by nn_sum_axis_parts, the parts then added in order), nn_sum_slices (a weight
//                gradient's slices, dw's and db's together, in one pass of thread groups), nn_sum_rows (one
//                block per row, a fixed tree), nn_expand_axis (the sums' backward), nn_softmax_rows and
//                nn_softmax_rows_grad (a warp per row; log_softmax too).
//   products     nn_matmul (gemm_tile, batched, either operand transposed), nn_linear (x·Wᵀ with the bias
//                and an activation in the epilogue), nn_linear_grad_weight (dW and db in one product) and
//                nn_linear_grad (dx, dW and db in one launch; dx times the slope of the activation before
//                the layer when the backward fuses it), each in three tiles (_large, _small, _tiny:
//                small grids split k inside the block), nn_linear_grad_weights (the weight gradients
//                the backward deferred, several layers' in one launch, a table of them); in bf16,
//                nn_to_bf16 (an operand rounded once) and nn_product_bf16_{nn,nt,tn,tt} (Bf16Tile: `wgmma`
//                on Hopper; batched, one kernel a layout, bias), nn_product_bf16_{act} (an activation
//                after) and nn_product_bf16_{act}_slope (dx times an activation's slope, the backward's
//                fusion).
//   losses       nn_cross_entropy (a warp per row: the row's loss and softmax − onehot, rows to ignore
//                give 0; the mean over the counted rows by the last block), nn_linear_cross_entropy_{tile}
//                (a linear layer's logits, ≤ 64 a row, and their cross-entropy in one launch: the
//                capture-time fusion of a classifier's last layer; after an activation, the layer's dx
//                too), nn_scale_by (a saved gradient times the upstream scalar gradient).
//   optimizer    nn_update_tensors (optim.cuh's update of many tensors a launch; its last block advances
//                their step counts), nn_sum_squares_chunks, nn_clip_factor and nn_scale_chunks
//                (clip_grad_norm over many gradients a launch).
//   layers       nn_layer_norm (a warp per row; μ and 1/σ kept), nn_layer_norm_grad (dx, a warp per row),
//                nn_layer_norm_grad_affine (dweight and dbias over parts of the rows, a thread per (part, column)
//                summing its rows in order; the parts then added in order),
//                nn_embedding and nn_embedding_grad (a thread per weight element summing its ids' rows in
//                order, from a host-built list), nn_dropout (dropout.cuh's hashed mask; its own backward),
//                nn_attention, nn_attention_grad_q (a warp per query row) and nn_attention_grad_kv (a
//                thread per key element summing query rows in order).
//   shapes       nn_copy_run (a run along one axis copied between a piece and the whole: narrow, cat and
//                their backwards), nn_pad_run (narrow's backward: the run among zeros).
//   images       nn_conv2d_{16,32,64}, nn_conv2d_grad_input_{…} and nn_conv2d_grad_weight_{…} (fp32
//                conv2d and its gradients as products whose operands are staged from the windows where they
//                lie: no col, outputs in [N, C, H, W] order; dw and db in one product, sliced over the
//                positions), nn_conv2d_direct and nn_conv2d_direct_grad_weight (the same where a band of
//                the image fits in shared memory: the band staged once a block, each window read from it),
//                nn_conv2d_mma and nn_conv2d_mma_grad_weight (those bands' products on the tensor cores,
//                3xTF32, or TF32 at Device::set_precision(Tf32));
//                nn_im2col and nn_col2im (the bf16 path: col as a product's operand, and its
//                input gradient, a thread per input element summing its taps in order), nn_max_pool (the
//                first largest of each window, its place kept) and nn_max_pool_grad (a thread per input
//                element summing, in order, the outputs it won; nn_max_pool_grad_tiled, a thread a window,
//                where the windows tile the input; either times the slope of a ReLU before the pool when the
//                backward fuses it).
//
// No float atomics: every output element is written by one thread, every sum runs in a fixed order, so a
// run repeats to the bit. Every kernel begins with begin_after_previous_grid() (dependent_launch.cuh), so
// each may be launched with programmatic dependent launch; src/nn/cuda/mod.rs's Device says whether it is
// (not by default: measured slower there).
#include "activations.cuh"
#include "common.cuh"
#include "dependent_launch.cuh"
#include "dropout.cuh"
#include "gemm.cuh"
#include "gemm_wgmma.cuh"
#include "optim.cuh"

constexpr int OP_ADD = 0, OP_SUB = 1, OP_MUL = 2, OP_DIV = 3;
constexpr int UNARY_RELU = 0, UNARY_SIGMOID = 1, UNARY_TANH = 2, UNARY_GELU = 3, UNARY_EXP = 4, UNARY_LOG = 5,
              UNARY_NEG = 6;

__device__ __forceinline__ int grid_index() { return blockIdx.x * THREADS + threadIdx.x; }
__device__ __forceinline__ int grid_stride() { return gridDim.x * THREADS; }

__device__ __forceinline__ float binary_apply(int op, float a, float b) {
    switch (op) {
        case OP_ADD: return a + b;
        case OP_SUB: return a - b;
        case OP_MUL: return a * b;
        default: return a / b;
    }
}

// ∂(a op b)/∂a when `which` is 0, ∂(a op b)/∂b when 1.
__device__ __forceinline__ float binary_partial(int op, int which, float a, float b) {
    switch (op) {
        case OP_ADD: return 1.0f;
        case OP_SUB: return which ? -1.0f : 1.0f;
        case OP_MUL: return which ? a : b;
        default: return which ? -a / (b * b) : 1.0f / b;
    }
}

// Four axes of an output shape and one operand's strides along them (0 where it is broadcast).
struct Axes4 {
    int d0, d1, d2, d3;
};
struct Strides4 {
    int s0, s1, s2, s3;
    __device__ __forceinline__ int at(int i0, int i1, int i2, int i3) const {
        return i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3;
    }
};

// The operand offset of output element e.
__device__ __forceinline__ int offset_of(int e, Axes4 d, Strides4 s) {
    const int i3 = e % d.d3;
    e /= d.d3;
    const int i2 = e % d.d2;
    e /= d.d2;
    const int i1 = e % d.d1;
    return s.at(e / d.d1, i1, i2, i3);
}

// out[e] = a[·] op b[·] over the n = d0·d1·d2·d3 elements of the output.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_binary(int op, const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out, int n, int d0,
          int d1, int d2, int d3, int a0, int a1, int a2, int a3, int b0, int b1, int b2, int b3) {
    begin_after_previous_grid();
    const Axes4 d{d0, d1, d2, d3};
    const Strides4 sa{a0, a1, a2, a3}, sb{b0, b1, b2, b3};
    for (int e = grid_index(); e < n; e += grid_stride())
        out[e] = binary_apply(op, a[offset_of(e, d, sa)], b[offset_of(e, d, sb)]);
}

// The gradient of operand `which` (0: a, 1: b), of `count` elements: each element sums dy·∂out/∂operand
// over the output positions it was read at, in row-major order (its own axes fixed, the axes it was
// broadcast along walked from 0 up).
extern "C" __global__ void __launch_bounds__(THREADS)
nn_binary_grad(int op, int which, const float* __restrict__ a, const float* __restrict__ b,
               const float* __restrict__ dy, float* __restrict__ grad, int count, int d0, int d1, int d2, int d3,
               int a0, int a1, int a2, int a3, int b0, int b1, int b2, int b3) {
    begin_after_previous_grid();
    const Strides4 sa{a0, a1, a2, a3}, sb{b0, b1, b2, b3};
    const Strides4 own = which ? sb : sa;
    // The operand's own extent along each axis (1 where broadcast), and its coordinates there.
    const int e0 = own.s0 ? d0 : 1, e1 = own.s1 ? d1 : 1, e2 = own.s2 ? d2 : 1, e3 = own.s3 ? d3 : 1;
    for (int j = grid_index(); j < count; j += grid_stride()) {
        int r = j;
        const int c3 = r % e3;
        r /= e3;
        const int c2 = r % e2;
        r /= e2;
        const int c1 = r % e1;
        const int c0 = r / e1;
        float sum = 0.0f;
        for (int i0 = e0 > 1 ? c0 : 0; i0 < (e0 > 1 ? c0 + 1 : d0); ++i0)
            for (int i1 = e1 > 1 ? c1 : 0; i1 < (e1 > 1 ? c1 + 1 : d1); ++i1)
                for (int i2 = e2 > 1 ? c2 : 0; i2 < (e2 > 1 ? c2 + 1 : d2); ++i2)
                    for (int i3 = e3 > 1 ? c3 : 0; i3 < (e3 > 1 ? c3 + 1 : d3); ++i3) {
                        const int e = ((i0 * d1 + i1) * d2 + i2) * d3 + i3;
                        const float x = a[sa.at(i0, i1, i2, i3)], y = b[sb.at(i0, i1, i2, i3)];
                        sum += dy[e] * binary_partial(op, which, x, y);
                    }
        grad[j] = sum;
    }
}

// out = x op value (reversed: value op x); dx, when not null, = dy · ∂out/∂x.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_scalar(int op, int reversed, const float* __restrict__ x, float value, float* __restrict__ out, int n) {
    begin_after_previous_grid();
    for (int i = grid_index(); i < n; i += grid_stride())
        out[i] = reversed ? binary_apply(op, value, x[i]) : binary_apply(op, x[i], value);
}

extern "C" __global__ void __launch_bounds__(THREADS)
nn_scalar_grad(int op, int reversed, const float* __restrict__ x, float value, const float* __restrict__ dy,
               float* __restrict__ dx, int n) {
    begin_after_previous_grid();
    for (int i = grid_index(); i < n; i += grid_stride())
        dx[i] = dy[i] * (reversed ? binary_partial(op, 1, value, x[i]) : binary_partial(op, 0, x[i], value));
}

__device__ __forceinline__ float unary_apply(int kind, float x) {
    switch (kind) {
        case UNARY_RELU: return activate(ACT_RELU, x);
        case UNARY_SIGMOID: return activate(ACT_SIGMOID, x);
        case UNARY_TANH: return activate(ACT_TANH, x);
        case UNARY_GELU: return gelu(x);
        case UNARY_EXP: return expf(x);
        case UNARY_LOG: return logf(x);
        case UNARY_NEG: return -x;
        default: return x;
    }
}

// f′ at x, given y = f(x).
__device__ __forceinline__ float unary_slope(int kind, float x, float y) {
    switch (kind) {
        case UNARY_RELU: return activation_slope(ACT_RELU, y);
        case UNARY_SIGMOID: return activation_slope(ACT_SIGMOID, y);
        case UNARY_TANH: return activation_slope(ACT_TANH, y);
        case UNARY_GELU: return gelu_slope(x);
        case UNARY_EXP: return y;
        case UNARY_LOG: return 1.0f / x;
        case UNARY_NEG: return -1.0f;
        default: return 1.0f;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
nn_unary(int kind, const float* __restrict__ x, float* __restrict__ y, int n) {
    begin_after_previous_grid();
    for (int i = grid_index(); i < n; i += grid_stride()) y[i] = unary_apply(kind, x[i]);
}

// out = a + b over n elements of one shape, and activated = relu(out) beside it: a sum whose one reader is a
// ReLU (the residual block's x + f(x), then ReLU) in one launch, the capture-time fusion add → relu. The
// expressions are nn_binary's and nn_unary's, so the bits are those of the two launches.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_add_relu(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
            float* __restrict__ activated, int n) {
    begin_after_previous_grid();
    for (int e = grid_index(); e < n; e += grid_stride()) {
        const float sum = binary_apply(OP_ADD, a[e], b[e]);
        out[e] = sum;
        activated[e] = unary_apply(UNARY_RELU, sum);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
nn_unary_grad(int kind, const float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ dy,
              float* __restrict__ dx, int n) {
    begin_after_previous_grid();
    for (int i = grid_index(); i < n; i += grid_stride()) dx[i] = dy[i] * unary_slope(kind, x[i], y[i]);
}

// out[e] = x[offset of e] over an output of four axes: a transpose or permutation when the strides are
// the input's, permuted.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_gather(const float* __restrict__ x, float* __restrict__ out, int n, int d0, int d1, int d2, int d3, int s0, int s1,
          int s2, int s3) {
    begin_after_previous_grid();
    const Axes4 d{d0, d1, d2, d3};
    const Strides4 s{s0, s1, s2, s3};
    for (int e = grid_index(); e < n; e += grid_stride()) out[e] = x[offset_of(e, d, s)];
}

// out[o·inner + i] = scale · Σ_k x[(o·n + k)·inner + i], k from 0 up: one thread per output.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_sum_axis(const float* __restrict__ x, float* __restrict__ out, int outer, int n, int inner, float scale) {
    begin_after_previous_grid();
    for (int e = grid_index(); e < outer * inner; e += grid_stride()) {
        const int o = e / inner, i = e % inner;
        const float* from = x + (size_t)o * n * inner + i;
        float sum = 0.0f;
        for (int k = 0; k < n; ++k) sum += from[(size_t)k * inner];
        out[e] = sum * scale;
    }
}

// The first pass of a long sum: part[p·outer·inner + o·inner + i] = Σ_k x[(o·n + k)·inner + i] over part
// p's rows k from p·rows_per_part up, a thread per (part, output); nn_sum_axis then adds the parts in order.
// Enough threads to fill the GPU where one thread per output would walk a long axis alone.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_sum_axis_parts(const float* __restrict__ x, float* __restrict__ part, int outer, int n, int inner,
                  int rows_per_part) {
    begin_after_previous_grid();
    const int outputs = outer * inner, parts = (n + rows_per_part - 1) / rows_per_part;
    for (int e = grid_index(); e < parts * outputs; e += grid_stride()) {
        const int p = e / outputs, o = e % outputs / inner, i = e % inner, end = min(n, (p + 1) * rows_per_part);
        const float* from = x + (size_t)o * n * inner + i;
        float sum = 0.0f;
        for (int k = p * rows_per_part; k < end; ++k) sum += from[(size_t)k * inner];
        part[e] = sum;
    }
}

// A weight gradient's slices added, dw's and db's together, in one launch: out_a[i] = Σ_s a[s·width_a + i]
// and out_b[i] = Σ_s b[s·width_b + i] (b null where width_b is 0). A block takes SUM_SLICES_COLUMNS columns
// (a's, then b's) in SUM_SLICES_GROUPS thread groups: group g adds slices g, g + GROUPS, … from 0 up (a
// warp reads 32-byte runs of four slices), then the column's thread of group 0 adds the groups' sums from
// group 0 on. The order depends on nothing but the count of slices, so a run repeats to the bit on any GPU.
// (Two launches, parts of the slices and then the parts, took 4.7 µs each in the ResNet example's step.)
constexpr int SUM_SLICES_COLUMNS = 8, SUM_SLICES_GROUPS = THREADS / SUM_SLICES_COLUMNS;
extern "C" __global__ void __launch_bounds__(THREADS)
nn_sum_slices(const float* __restrict__ a, float* __restrict__ out_a, int width_a, const float* __restrict__ b,
              float* __restrict__ out_b, int width_b, int slices) {
    begin_after_previous_grid();
    __shared__ float sums[SUM_SLICES_GROUPS][SUM_SLICES_COLUMNS];
    const int column = threadIdx.x % SUM_SLICES_COLUMNS, group = threadIdx.x / SUM_SLICES_COLUMNS;
    const int i = blockIdx.x * SUM_SLICES_COLUMNS + column;
    const bool in_a = i < width_a, real = i < width_a + width_b;
    float sum = 0.0f;
    if (real) {
        const float* from = in_a ? a + i : b + (i - width_a);
        const size_t stride = in_a ? width_a : width_b;
#pragma unroll 4
        for (int s = group; s < slices; s += SUM_SLICES_GROUPS) sum += from[(size_t)s * stride];
    }
    sums[group][column] = sum;
    __syncthreads();
    if (group == 0 && real) {
        float total = sums[0][column];
        for (int g = 1; g < SUM_SLICES_GROUPS; ++g) total += sums[g][column];
        if (in_a) out_a[i] = total;
        else out_b[i - width_a] = total;
    }
}

// out[r] = scale · Σ of row r's n elements: one block per row, each thread a strided part, then a fixed tree.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_sum_rows(const float* __restrict__ x, float* __restrict__ out, int n, float scale) {
    begin_after_previous_grid();
    __shared__ float scratch[WARPS];
    const float* row = x + (size_t)blockIdx.x * n;
    float sum = 0.0f;
    for (int k = threadIdx.x; k < n; k += THREADS) sum += row[k];
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) out[blockIdx.x] = sum * scale;
}

// dx[(o·n + k)·inner + i] = scale · dy[o·inner + i]: the gradient of a sum (scale 1) or mean (1/n).
extern "C" __global__ void __launch_bounds__(THREADS)
nn_expand_axis(const float* __restrict__ dy, float* __restrict__ dx, int outer, int n, int inner, float scale) {
    begin_after_previous_grid();
    const int count = outer * n * inner;
    for (int e = grid_index(); e < count; e += grid_stride()) {
        const int i = e % inner, o = e / inner / n;
        dx[e] = dy[o * inner + i] * scale;
    }
}

// Row softmax (or log-softmax when `log`) of `rows` rows of n: one warp per row, max then Σexp then the
// outputs, as cpu::softmax_in_place.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_softmax_rows(const float* __restrict__ x, float* __restrict__ y, int rows, int n, int log) {
    begin_after_previous_grid();
    const int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* in = x + (size_t)row * n;
    float* out = y + (size_t)row * n;
    float m = NEG_INF;
    for (int j = lane; j < n; j += 32) m = fmaxf(m, in[j]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = lane; j < n; j += 32) sum += expf(in[j] - m);
    sum = warp_sum(sum);
    const float log_sum = logf(sum);
    for (int j = lane; j < n; j += 32) out[j] = log ? in[j] - m - log_sum : expf(in[j] - m) / sum;
}

// softmax: dx = y ⊙ (dy − Σ dy⊙y); log_softmax: dx = dy − exp(y)·Σ dy.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_softmax_rows_grad(const float* __restrict__ y, const float* __restrict__ dy, float* __restrict__ dx, int rows, int n,
                     int log) {
    begin_after_previous_grid();
    const int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const size_t base = (size_t)row * n;
    float dot = 0.0f;
    for (int j = lane; j < n; j += 32) dot += log ? dy[base + j] : dy[base + j] * y[base + j];
    dot = warp_sum(dot);
    for (int j = lane; j < n; j += 32) {
        const float g = dy[base + j], v = y[base + j];
        dx[base + j] = log ? g - expf(v) * dot : v * (g - dot);
    }
}

// ---- products: C = op(A)·op(B) per batch, C M×N row-major; A M×K row-major (K×M when trans_a), B K×N
// (N×K when trans_b); batch z reads A at z·stride_a, B at z·stride_b (0: one operand shared). ----
//
// Each fp32 product comes in three tiles; the launch layer (src/nn/cuda/ops.rs, `fp32_tile`) takes the
// largest whose grid fills the GPU. Large: 64×64 outputs, 16 deep, 4×4 a thread. Small: 16×16, 64 deep, 2×2
// a thread, k shared among 4 groups of the block's threads. Tiny: 8×8, 256 deep, k shared among 16 groups
// (gemm_tile's KSPLIT; the groups' sums added in a fixed order). A small batch's layer, 64 rows × 128
// outputs over 784 inputs, is 2 large tiles, 130 µs on 2 SMs; as 128 tiny tiles it takes every SM.
template <int BM_, int BN_, int BK_, int TM_, int TN_>
struct MatTile {
    static constexpr int BM = BM_, BN = BN_, BK = BK_, TM = TM_, TN = TN_;
};
using TileLarge = MatTile<64, 64, 16, 4, 4>;
using TileSmall = MatTile<16, 16, 64, 2, 2>;
using TileTiny = MatTile<8, 8, 256, 2, 2>;

// `ld`: the length of a row of an operand whose k runs along its rows (a not transposed, b transposed): K,
// or more for a product over a slice of k (a split of k, see matmul).
template <class T, bool TA, bool TB>
__device__ __forceinline__ void matmul_tile(const float* a, const float* b, float* c, int M, int N, int K, int ld,
                                            int m0, int n0, float* smem) {
    gemm_tile<T::BM, T::BN, T::BK, T::TM, T::TN, TA, TB>(
        M, N, K, m0, n0, [&](int m, int k) { return TA ? a[(size_t)k * M + m] : a[(size_t)m * ld + k]; },
        [&](int k, int n) { return TB ? b[(size_t)n * ld + k] : b[(size_t)k * N + n]; },
        [&](int m, int n, float v) { c[(size_t)m * N + n] = v; }, smem);
}

// Batched c_z = a_z·b_z, each operand z at z·stride. Grid: (⌈N/BN⌉, ⌈M/BM⌉·batches); dynamic shared memory
// GemmTile<T>::SHARED_FLOATS floats. With ld > K, batch z is the slice [z·K, (z + 1)·K) of a longer k (the
// strides K for a k-contiguous operand, K·M or K·N otherwise): the launch layer splits a product of few
// outputs over a long k so, and sums the batches' results in order (a convolution's weight gradient: 16×144
// outputs over 100,352 positions took 36 blocks walking all of k).
template <class T>
__device__ __forceinline__ void matmul(const float* __restrict__ a, const float* __restrict__ b,
                                       float* __restrict__ c, int M, int N, int K, int ld, int stride_a,
                                       int stride_b, int trans_a, int trans_b) {
    extern __shared__ float smem[];
    const int row_tiles = (M + T::BM - 1) / T::BM;
    const int z = blockIdx.y / row_tiles, m0 = blockIdx.y % row_tiles * T::BM, n0 = blockIdx.x * T::BN;
    a += (size_t)z * stride_a;
    b += (size_t)z * stride_b;
    c += (size_t)z * M * N;
    if (trans_a) {
        if (trans_b) matmul_tile<T, true, true>(a, b, c, M, N, K, ld, m0, n0, smem);
        else matmul_tile<T, true, false>(a, b, c, M, N, K, ld, m0, n0, smem);
    } else {
        if (trans_b) matmul_tile<T, false, true>(a, b, c, M, N, K, ld, m0, n0, smem);
        else matmul_tile<T, false, false>(a, b, c, M, N, K, ld, m0, n0, smem);
    }
}

// y = act(x·Wᵀ + b) for x R×K, W N×K, b of N (or null); z, when not null, keeps x·Wᵀ + b (the activation's
// backward reads it). act: UNARY_* or −1 (none). With `dropped`, also y times the dropout mask of the key
// drop_key[0] (nn_dropout_keyed's expression, capture-time fusion). Grid: (⌈N/BN⌉, ⌈R/BM⌉), shared memory
// as matmul's.
template <class T>
__device__ __forceinline__ void linear(const float* __restrict__ x, const float* __restrict__ W,
                                       const float* __restrict__ bias, float* __restrict__ z, float* __restrict__ y,
                                       int R, int N, int K, int act, float* __restrict__ dropped,
                                       const unsigned* __restrict__ drop_key, unsigned threshold, float drop_scale) {
    extern __shared__ float smem[];
    const unsigned key = dropped ? drop_key[0] : 0u;
    gemm_tile<T::BM, T::BN, T::BK, T::TM, T::TN, false, true>(
        R, N, K, blockIdx.y * T::BM, blockIdx.x * T::BN, [&](int r, int k) { return x[(size_t)r * K + k]; },
        [&](int k, int o) { return W[(size_t)o * K + k]; },
        [&](int r, int o, float acc) {
            const size_t e = (size_t)r * N + o;
            const float pre = bias ? acc + bias[o] : acc;
            if (z) z[e] = pre;
            const float out = unary_apply(act, pre);
            y[e] = out;
            if (dropped) dropped[e] = out * dropout_factor(key, (unsigned)e, threshold, drop_scale);
        },
        smem);
}

// A linear layer's parameter gradients from dy (R×N) and its input x (R×K): dW = dyᵀ·x (N×K) and, when
// db is not null, db = dyᵀ·1 (of N), as one product over x with a column of ones appended: the bias
// gradient is the tile's last column, not two more launches summing dy's rows. This is the tile at (m0, n0)
// of the N × (K + 1) results.
template <class T>
__device__ __forceinline__ void linear_grad_weight_tile(const float* __restrict__ dy, const float* __restrict__ x,
                                                        float* __restrict__ dW, float* __restrict__ db, int R,
                                                        int N, int K, int m0, int n0, float* smem) {
    gemm_tile<T::BM, T::BN, T::BK, T::TM, T::TN, true, false>(
        N, db ? K + 1 : K, R, m0, n0,
        [&](int o, int r) { return dy[(size_t)r * N + o]; },
        [&](int r, int i) { return i < K ? x[(size_t)r * K + i] : 1.0f; },
        [&](int o, int i, float v) {
            if (i < K) dW[(size_t)o * K + i] = v;
            else db[o] = v;
        },
        smem);
}

// linear_grad_weight_tile over the grid (⌈(K + 1)/BN⌉, ⌈N/BM⌉).
template <class T>
__device__ __forceinline__ void linear_grad_weight(const float* __restrict__ dy, const float* __restrict__ x,
                                                   float* __restrict__ dW, float* __restrict__ db, int R, int N,
                                                   int K) {
    extern __shared__ float smem[];
    linear_grad_weight_tile<T>(dy, x, dW, db, R, N, K, blockIdx.y * T::BM, blockIdx.x * T::BN, smem);
}

// A linear layer's whole backward in one launch: the first blocks compute dx = dy·W (R×K, W N×K) a tile
// each, ⌈K/BN⌉ tiles to a row of tiles, the rest linear_grad_weight_tile's dW and db, ⌈(K + 1)/BN⌉ to a
// row; in a small step the launches, not the products, take the time. Grid: (dx tiles + dW tiles).
// With act_pre (the backward's fusion, nn/autograd.rs): x is act(act_pre), an activation whose one reader
// is this layer, and dx is its input's gradient, dy·W times the activation's slope, nn_unary_grad's
// expression: the activation's backward is then no launch of its own.
template <class T>
__device__ __forceinline__ void linear_grad(const float* __restrict__ dy, const float* __restrict__ x,
                                            const float* __restrict__ W, float* __restrict__ dx,
                                            float* __restrict__ dW, float* __restrict__ db, int R, int N, int K,
                                            const float* __restrict__ act_pre, int act) {
    extern __shared__ float smem[];
    const int dx_cols = (K + T::BN - 1) / T::BN, dx_blocks = dx_cols * ((R + T::BM - 1) / T::BM);
    const int block = blockIdx.x;
    if (block < dx_blocks) {
        gemm_tile<T::BM, T::BN, T::BK, T::TM, T::TN, false, false>(
            R, K, N, block / dx_cols * T::BM, block % dx_cols * T::BN,
            [&](int r, int o) { return dy[(size_t)r * N + o]; }, [&](int o, int i) { return W[(size_t)o * K + i]; },
            [&](int r, int i, float v) {
                const size_t e = (size_t)r * K + i;
                dx[e] = act_pre ? v * unary_slope(act, act_pre[e], x[e]) : v;
            },
            smem);
        return;
    }
    const int dw_cols = (K + (db ? 1 : 0) + T::BN - 1) / T::BN, tile = block - dx_blocks;
    linear_grad_weight_tile<T>(dy, x, dW, db, R, N, K, tile / dw_cols * T::BM, tile % dw_cols * T::BN, smem);
}

#define NN_FP32_PRODUCTS(SUFFIX, TILE)                                                                         \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
    nn_matmul_##SUFFIX(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int M,   \
                       int N, int K, int ld, int stride_a, int stride_b, int trans_a, int trans_b) {           \
        begin_after_previous_grid();                                                                           \
        matmul<TILE>(a, b, c, M, N, K, ld, stride_a, stride_b, trans_a, trans_b);                              \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
    nn_linear_##SUFFIX(const float* __restrict__ x, const float* __restrict__ W, const float* __restrict__ bias, \
                       float* __restrict__ z, float* __restrict__ y, int R, int N, int K, int act,             \
                       float* __restrict__ dropped, const unsigned* __restrict__ drop_key, unsigned threshold,  \
                       float drop_scale) { begin_after_previous_grid();                                                                     \
        linear<TILE>(x, W, bias, z, y, R, N, K, act, dropped, drop_key, threshold, drop_scale);                \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
    nn_linear_grad_weight_##SUFFIX(const float* __restrict__ dy, const float* __restrict__ x,                  \
                                   float* __restrict__ dW, float* __restrict__ db, int R, int N, int K) { begin_after_previous_grid();      \
        linear_grad_weight<TILE>(dy, x, dW, db, R, N, K);                                                      \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
    nn_linear_grad_##SUFFIX(const float* __restrict__ dy, const float* __restrict__ x,                         \
                            const float* __restrict__ W, float* __restrict__ dx, float* __restrict__ dW,       \
                            float* __restrict__ db, int R, int N, int K, const float* __restrict__ act_pre,    \
                            int act) { begin_after_previous_grid();                                                                         \
        linear_grad<TILE>(dy, x, W, dx, dW, db, R, N, K, act_pre, act);                                        \
    }
NN_FP32_PRODUCTS(large, TileLarge)
NN_FP32_PRODUCTS(small, TileSmall)
NN_FP32_PRODUCTS(tiny, TileTiny)
#undef NN_FP32_PRODUCTS

// ---- products on the bf16 tensor cores (Precision::Bf16, PyTorch autocast's bf16 matmul) ----
// Each operand is rounded to bf16 (to nearest even) once, by nn_to_bf16, into a copy the product reads (and
// a linear layer keeps for its backward); Bf16Tile's 128×128 tile (gemm_wgmma.cuh: `wgmma` on sm_90a,
// mma.sync fed by cp.async elsewhere) sums the exact bf16 products in fp32 in a fixed order.

// out[i] = x[i] rounded to bf16, over n elements.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_to_bf16(const float* __restrict__ x, bf16* __restrict__ out, int n) {
    begin_after_previous_grid();
    for (int i = grid_index(); i < n; i += grid_stride()) out[i] = to_bf16(x[i]);
}

// C = op(A)·op(B) (+ bias) per batch, A and B bf16 (nn_to_bf16's), as nn_matmul lays them out (batch z
// reads A at z·stride_a, B at z·stride_b, in bf16 elements); bias of N optional. With slices > 1 (split k:
// a weight gradient's few tiles over a long k), the blocks of slice s sum k in [s·k_per, (s + 1)·k_per)
// into C + s·batches·M·N, and the launch layer adds the slices in order (no bias then). Grid (⌈N/128⌉,
// ⌈M/128⌉·batches·slices); Bf16Tile::SHARED_FLOATS floats.
//
// One kernel per layout (nn_product_bf16_{nn,nt,tn,tt}: A, B transposed or not) and no activation in the
// epilogue: a kernel that branched over the four layouts and an activation took 171 registers a thread,
// one block an SM, and ran nanoGPT's products at less than half the Transformer's speed on the same tile
// (126 registers, two blocks an SM).
template <bool TA, bool TB>
__device__ __forceinline__ void product_bf16(const bf16* __restrict__ a, const bf16* __restrict__ b,
                                             float* __restrict__ c, const float* __restrict__ bias, int M, int N,
                                             int K, int stride_a, int stride_b, int batches, int k_per) {
    extern __shared__ __align__(16) float smem[];
    const int row_tiles = (M + Bf16Tile::BM - 1) / Bf16Tile::BM, per_slice = row_tiles * batches;
    const int slice = blockIdx.y / per_slice, tile = blockIdx.y % per_slice;
    const int batch = tile / row_tiles, m0 = tile % row_tiles * Bf16Tile::BM, n0 = blockIdx.x * Bf16Tile::BN;
    const int k0 = slice * k_per, k_count = min(k_per, K - k0);
    a += (size_t)batch * stride_a + (size_t)k0 * (TA ? M : 1);
    b += (size_t)batch * stride_b + (size_t)k0 * (TB ? 1 : N);
    c += ((size_t)slice * batches + batch) * M * N;
    const bool vector = aligned16(c) && (!bias || aligned16(bias));
    const auto out_by_rows = [&](int m, int n, float4 v, int count, bool whole) {
        float* out = c + (size_t)m * N + n;
        if (whole && vector) {
            if (bias) {
                const float4 add = *reinterpret_cast<const float4*>(bias + n);
                v = make_float4(v.x + add.x, v.y + add.y, v.z + add.z, v.w + add.w);
            }
            *reinterpret_cast<float4*>(out) = v;
        } else {
            const float values[4] = {v.x, v.y, v.z, v.w};
            for (int j = 0; j < count; ++j) out[j] = bias ? values[j] + bias[n + j] : values[j];
        }
    };
    gemm_tile_bf16_by_rows<TA, TB>(M, N, k_count, m0, n0, a, TA ? M : K, b, TB ? K : N, smem, out_by_rows);
}

// x·Wᵀ + b as nn_product_bf16_nt, kept in c (the activation's backward reads it), and its activation ACT
// (UNARY_*) in y, and y's bf16 copy in y16 when not null: a linear layer and the activation after it in
// one launch (capture-time fusion, src/nn/cuda/fusion.rs). With DROP (and no activation), y is instead c
// times the dropout mask of the key drop_key[0] (nn_dropout_keyed's expression): a linear layer and the
// dropout after it. The activation is a template argument (with a run-time switch and single stores the
// epilogue ran the product at a third of its speed), and on the wgmma tile the results leave by rows,
// 16 bytes a store (gemm_tile_bf16_by_rows). Grid (⌈N/128⌉, ⌈M/128⌉).
template <int ACT, bool DROP>
__device__ __forceinline__ void product_bf16_act(const bf16* __restrict__ a, const bf16* __restrict__ b,
                                                 float* __restrict__ c, const float* __restrict__ bias,
                                                 float* __restrict__ y, bf16* __restrict__ y16,
                                                 const unsigned* __restrict__ drop_key, unsigned threshold,
                                                 float drop_scale, int M, int N, int K) {
    extern __shared__ __align__(16) float smem[];
    const int m0 = blockIdx.y * Bf16Tile::BM, n0 = blockIdx.x * Bf16Tile::BN;
    const unsigned key = DROP ? drop_key[0] : 0u;
    // The activation of the sum with its bias, or the dropout's factor of element e.
    const auto after = [&](float v, size_t e) {
        return DROP ? v * dropout_factor(key, (unsigned)e, threshold, drop_scale) : unary_apply(ACT, v);
    };
    const bool vector = aligned16(c) && aligned16(y) && (!bias || aligned16(bias)) &&
                        reinterpret_cast<size_t>(y16) % 8 == 0;
    const auto out_by_rows = [&](int m, int n, float4 v, int count, bool whole) {
        const size_t e = (size_t)m * N + n;
        float sum[4] = {v.x, v.y, v.z, v.w}, out[4];
        if (whole && vector) {
            if (bias) {
                const float4 add = *reinterpret_cast<const float4*>(bias + n);
                sum[0] += add.x, sum[1] += add.y, sum[2] += add.z, sum[3] += add.w;
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) out[j] = after(sum[j], e + j);
            *reinterpret_cast<float4*>(c + e) = make_float4(sum[0], sum[1], sum[2], sum[3]);
            *reinterpret_cast<float4*>(y + e) = make_float4(out[0], out[1], out[2], out[3]);
            if (y16) *reinterpret_cast<uint2*>(y16 + e) = {bf16x2(out[0], out[1]), bf16x2(out[2], out[3])};
        } else {
            for (int j = 0; j < count; ++j) {
                const float s = bias ? sum[j] + bias[n + j] : sum[j], o = after(s, e + j);
                c[e + j] = s;
                y[e + j] = o;
                if (y16) y16[e + j] = to_bf16(o);
            }
        }
    };
    gemm_tile_bf16_by_rows<false, true>(M, N, K, m0, n0, a, K, b, K, smem, out_by_rows);
}

#define NN_PRODUCT_BF16_ACT(NAME, ACT, DROP)                                                                   \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
    NAME(const bf16* __restrict__ a, const bf16* __restrict__ b, float* __restrict__ c,                        \
         const float* __restrict__ bias, float* __restrict__ y, bf16* __restrict__ y16,                        \
         const unsigned* __restrict__ drop_key, unsigned threshold, float drop_scale, int M, int N, int K) { begin_after_previous_grid();   \
        product_bf16_act<ACT, DROP>(a, b, c, bias, y, y16, drop_key, threshold, drop_scale, M, N, K);          \
    }
NN_PRODUCT_BF16_ACT(nn_product_bf16_relu, UNARY_RELU, false)
NN_PRODUCT_BF16_ACT(nn_product_bf16_sigmoid, UNARY_SIGMOID, false)
NN_PRODUCT_BF16_ACT(nn_product_bf16_tanh, UNARY_TANH, false)
NN_PRODUCT_BF16_ACT(nn_product_bf16_gelu, UNARY_GELU, false)
NN_PRODUCT_BF16_ACT(nn_product_bf16_dropout, -1, true)
#undef NN_PRODUCT_BF16_ACT

// dx = dy·W as nn_product_bf16_nn (no bias, no split k), each result times the slope of the activation
// ACT whose output x = ACT(pre) the layer read: the backward's fusion (src/nn/cuda/fusion.rs), with
// nn_unary_grad's expression, so the activation's backward is no launch and no pass over dx of its own.
// On the wgmma tile the results leave by rows (gemm_tile_bf16_by_rows): stored pair by pair, each pair after
// its own loads of pre, the epilogue was latency bound (nanoGPT's MLP dx, 16384×1536 over k = 384: 310 µs
// against 127 for the forward's product of the same size). Grid (⌈N/128⌉, ⌈M/128⌉).
template <int ACT>
__device__ __forceinline__ void product_bf16_slope(const bf16* __restrict__ a, const bf16* __restrict__ b,
                                                   float* __restrict__ c, const float* __restrict__ pre,
                                                   const float* __restrict__ x, int M, int N, int K) {
    extern __shared__ __align__(16) float smem[];
    const int m0 = blockIdx.y * Bf16Tile::BM, n0 = blockIdx.x * Bf16Tile::BN;
    const bool vector = aligned16(c) && aligned16(pre) && aligned16(x);
    const auto out_by_rows = [&](int m, int n, float4 v, int count, bool whole) {
        const size_t e = (size_t)m * N + n;
        if (whole && vector) {
            const float4 p = *reinterpret_cast<const float4*>(pre + e);
            const float4 y = *reinterpret_cast<const float4*>(x + e);
            *reinterpret_cast<float4*>(c + e) =
                make_float4(v.x * unary_slope(ACT, p.x, y.x), v.y * unary_slope(ACT, p.y, y.y),
                            v.z * unary_slope(ACT, p.z, y.z), v.w * unary_slope(ACT, p.w, y.w));
        } else {
            const float values[4] = {v.x, v.y, v.z, v.w};
            for (int j = 0; j < count; ++j) c[e + j] = values[j] * unary_slope(ACT, pre[e + j], x[e + j]);
        }
    };
    gemm_tile_bf16_by_rows<false, false>(M, N, K, m0, n0, a, K, b, N, smem, out_by_rows);
}

#define NN_PRODUCT_BF16_SLOPE(NAME, ACT)                                                                       \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
    NAME(const bf16* __restrict__ a, const bf16* __restrict__ b, float* __restrict__ c,                        \
         const float* __restrict__ pre, const float* __restrict__ x, int M, int N, int K) { begin_after_previous_grid();                    \
        product_bf16_slope<ACT>(a, b, c, pre, x, M, N, K);                                                     \
    }
NN_PRODUCT_BF16_SLOPE(nn_product_bf16_relu_slope, UNARY_RELU)
NN_PRODUCT_BF16_SLOPE(nn_product_bf16_sigmoid_slope, UNARY_SIGMOID)
NN_PRODUCT_BF16_SLOPE(nn_product_bf16_tanh_slope, UNARY_TANH)
NN_PRODUCT_BF16_SLOPE(nn_product_bf16_gelu_slope, UNARY_GELU)
#undef NN_PRODUCT_BF16_SLOPE

#define NN_PRODUCT_BF16(NAME, TA, TB)                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS, 2)                                                   \
    NAME(const bf16* __restrict__ a, const bf16* __restrict__ b, float* __restrict__ c,                        \
         const float* __restrict__ bias, int M, int N, int K, int stride_a, int stride_b, int batches,         \
         int k_per) { begin_after_previous_grid();                                                                                          \
        product_bf16<TA, TB>(a, b, c, bias, M, N, K, stride_a, stride_b, batches, k_per);                      \
    }
NN_PRODUCT_BF16(nn_product_bf16_nn, false, false)
NN_PRODUCT_BF16(nn_product_bf16_nt, false, true)
NN_PRODUCT_BF16(nn_product_bf16_tn, true, false)
NN_PRODUCT_BF16(nn_product_bf16_tt, true, true)
#undef NN_PRODUCT_BF16

// One warp per row of C logits: loss[r] = log Σ exp(x) − x[t] and d[r] = softmax(x) − onehot(t), counted[r]
// = 1; or 0, 0 and 0 when t == ignore. Targets are class ids held as floats (exact below 2^24), so that a
// captured step can take them from a tensor; an id outside 0..C gives NaN, never a wrong number.
__device__ __forceinline__ void cross_entropy_row(const float* __restrict__ x, float* __restrict__ g, float id, int C,
                                                  float ignore, float row_scale, float& loss, float& counted) {
    const int lane = threadIdx.x % 32;
    if (id == ignore) {
        for (int j = lane; j < C; j += 32) g[j] = 0.0f;
        loss = counted = 0.0f;
        return;
    }
    if (!(id >= 0.0f && id < (float)C && id == floorf(id))) {
        for (int j = lane; j < C; j += 32) g[j] = __int_as_float(0x7fc00000);
        loss = __int_as_float(0x7fc00000), counted = 1.0f;
        return;
    }
    const int t = (int)id;
    float m = NEG_INF;
    for (int j = lane; j < C; j += 32) m = fmaxf(m, x[j]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = lane; j < C; j += 32) sum += expf(x[j] - m);
    sum = warp_sum(sum);
    for (int j = lane; j < C; j += 32) g[j] = (expf(x[j] - m) / sum - (j == t ? 1.0f : 0.0f)) * row_scale;
    loss = m + logf(sum) - x[t], counted = 1.0f;
}

// The last part of a cross-entropy launch: in the last block to finish (`ticket`, left at 0), mean[0] = Σ
// loss / Σ counted over `rows` rows, count[0] = Σ counted and one[0] = 1 (the seed of the loss's backward):
// each thread sums its rows from the first in order, then a fixed tree, whatever the grid.
__device__ __forceinline__ void cross_entropy_mean(const float* __restrict__ loss, const float* __restrict__ counted,
                                                   int rows, float* __restrict__ mean, float* __restrict__ count,
                                                   float* __restrict__ one, unsigned* __restrict__ ticket) {
    if (!last_block_to_finish(ticket, gridDim.x * gridDim.y)) return;
    __shared__ float scratch[WARPS];
    float s = 0.0f, c = 0.0f;
    for (int r = threadIdx.x; r < rows; r += THREADS) s += __ldcg(loss + r), c += __ldcg(counted + r);
    s = block_sum(s, scratch);
    c = block_sum(c, scratch);
    if (threadIdx.x == 0) mean[0] = s / c, count[0] = c, one[0] = 1.0f, ticket[0] = 0;
}

// cross_entropy_row over `rows` rows, a warp each (d times row_scale: 1/rows when no row can be ignored,
// the mean's gradient), then cross_entropy_mean. The mean is in the same launch: a loss of few rows took as
// long again in a launch of its own.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_cross_entropy(const float* __restrict__ logits, const float* __restrict__ targets, float* __restrict__ loss,
                 float* __restrict__ d, float* __restrict__ counted, int rows, int C, float ignore, float row_scale,
                 float* __restrict__ mean, float* __restrict__ count, float* __restrict__ one,
                 unsigned* __restrict__ ticket) {
    begin_after_previous_grid();
    const int row = blockIdx.x * WARPS + threadIdx.x / 32;
    if (row < rows) {
        float row_loss, row_counted;
        cross_entropy_row(logits + (size_t)row * C, d + (size_t)row * C, targets[row], C, ignore, row_scale,
                          row_loss, row_counted);
        if (threadIdx.x % 32 == 0) loss[row] = row_loss, counted[row] = row_counted;
    }
    cross_entropy_mean(loss, counted, rows, mean, count, one, ticket);
}

// A linear layer without activation, y = x·Wᵀ + b (x R×K, W N×K, b of N or null), and nn_cross_entropy of
// y, in one launch: the capture-time fusion of a classifier's last layer and its loss (src/nn/cuda/
// fusion.rs), one launch and one pass over the logits fewer in a small step. Block b takes rows [b·BM,
// (b + 1)·BM): it forms their N logits with the same sums, bit for bit, as nn_linear_{tile}'s (a gemm tile at
// a time, the very tiles nn_linear_{tile} forms; the tiny tile's blocks, BM = LOGIT_ROWS, each group of the
// tile's k split at once, logits_by_groups), then cross_entropy_row over its rows, a warp each; the last
// block takes the mean as nn_cross_entropy does. Grid: ⌈R/BM⌉ blocks; shared memory GemmTile of
// LogitsTile<tile> (the tiny tile's: none). The launch layer fuses only N ≤ LINEAR_CROSS_ENTROPY_CLASSES (a
// block then walks at most four tiles). The arguments after y and K are nn_cross_entropy's after its
// logits. With dx (not null), the block also forms its rows of the backward's dx = d·W, times the slope of
// the activation `act` of act_pre where x is that activation's output (act_pre not null), which the layer's
// backward then takes when the loss's gradient is d as it is (no launch of dx's tiles: nn_linear_grad's dx,
// to the bit, given its tile's dx_ksplit). The products are tiny: BM·N·K a block.
constexpr int LINEAR_CROSS_ENTROPY_CLASSES = 64;

// The tile a block forms its logits with: T, widened to 16 columns where it is narrower (TN widened with
// it), so that ten classes are one pass of the tile rather than two. Its BK and KSPLIT are T's, and a
// logit's sum depends on nothing else (each group's fmaf chain over its k, then the groups in order): the
// same bits as nn_linear_{tile}.
template <class T>
using LogitsTile = MatTile<T::BM, (T::BN < 16 ? 16 : T::BN), T::BK, T::TM, T::TN * (T::BN < 16 ? 16 / T::BN : 1)>;

// row_scale LINEAR_CROSS_ENTROPY_COUNT_ROWS (0): d is the gradient of the mean over the rows not ignored,
// 1/count · (softmax − onehot), where count is the targets other than `ignore` among all R, counted by every
// block (so the launch layer fuses it only up to LINEAR_CROSS_ENTROPY_COUNTED_ROWS rows). These are the bits
// nn_scale_by gives the unfused d (times 1, then 1/count), so that the layer's dx can be formed here too.
constexpr float LINEAR_CROSS_ENTROPY_COUNT_ROWS = 0.0f;
constexpr int LINEAR_CROSS_ENTROPY_COUNTED_ROWS = 8192;

// How many of the R targets are not `ignore` (every block counts them all; each thread gets the count).
__device__ __forceinline__ float rows_not_ignored(const float* __restrict__ targets, int R, float ignore) {
    __shared__ float scratch[WARPS];
    float counted = 0.0f;
    for (int r = threadIdx.x; r < R; r += THREADS) counted += targets[r] != ignore ? 1.0f : 0.0f;
    return block_sum(counted, scratch);
}

// dx = d·W, times the slope of the activation `act` of act_pre (x = act(act_pre)) where act_pre is not null,
// for rows [m0, m0 + rows),
// d's rows in shared memory (a row every LINEAR_CROSS_ENTROPY_CLASSES floats), each element summed as a
// gemm_tile of KSPLIT thread groups sums it: group g's fmaf chain over the outputs o ≡ g (mod KSPLIT), from
// o = g up, then the groups' sums added from group 0 on. A thread takes a column and DX_ROWS rows, so that
// each W element read serves DX_ROWS rows, and reads W sixteen outputs at a time, the loads ahead of the sums.
template <int KSPLIT, int BM>
__device__ __forceinline__ void linear_dx_rows(const float* d_rows, const float* __restrict__ W,
                                               const float* __restrict__ x, const float* __restrict__ act_pre,
                                               int act, float* __restrict__ dx, int m0, int rows, int N, int K) {
    constexpr int DX_ROWS = BM < 4 ? BM : 4, LOADS = 16;
    static_assert(BM % DX_ROWS == 0 && LOADS % KSPLIT == 0, "rows in fours, groups within a load");
    for (int item = threadIdx.x; item < (rows + DX_ROWS - 1) / DX_ROWS * K; item += THREADS) {
        const int k = item % K, r0 = item / K * DX_ROWS;
        float part[KSPLIT][DX_ROWS] = {};
        for (int o0 = 0; o0 < N; o0 += LOADS) {
            float w[LOADS];
#pragma unroll
            for (int j = 0; j < LOADS; ++j) w[j] = o0 + j < N ? W[(size_t)(o0 + j) * K + k] : 0.0f;
#pragma unroll
            for (int j = 0; j < LOADS; ++j) {
                if (o0 + j >= N) break;
#pragma unroll
                for (int i = 0; i < DX_ROWS; ++i)
                    part[j % KSPLIT][i] =
                        fmaf(d_rows[(r0 + i) * LINEAR_CROSS_ENTROPY_CLASSES + o0 + j], w[j], part[j % KSPLIT][i]);
            }
        }
#pragma unroll
        for (int i = 0; i < DX_ROWS; ++i) {
            if (r0 + i >= rows) break;
            float sum = part[0][i];
#pragma unroll
            for (int g = 1; g < KSPLIT; ++g) sum += part[g][i];
            const size_t e = (size_t)(m0 + r0 + i) * K + k;
            dx[e] = act_pre ? sum * unary_slope(act, act_pre[e], x[e]) : sum;
        }
    }
}
// The rows [m0, m0 + BM) of y = x·Wᵀ + b (x R×K, W N×K, b of N or null), formed by gemm tiles of LogitsTile<T>,
// the very tiles nn_linear_{tile} forms: into y and the block's `logits` (a row every
// LINEAR_CROSS_ENTROPY_CLASSES floats).
template <class T>
__device__ __forceinline__ void logits_by_tiles(const float* __restrict__ x, const float* __restrict__ W,
                                                const float* __restrict__ bias, float* __restrict__ y, float* logits,
                                                int R, int N, int K, int m0) {
    using L = LogitsTile<T>;
    static_assert(GemmTile<L::BM, L::BN, L::BK, L::TM, L::TN>::KSPLIT ==
                      GemmTile<T::BM, T::BN, T::BK, T::TM, T::TN>::KSPLIT,
                  "the logits' sums are nn_linear's");
    extern __shared__ float smem[];
    for (int n0 = 0; n0 < N; n0 += L::BN) {
        gemm_tile<L::BM, L::BN, L::BK, L::TM, L::TN, false, true>(
            R, N, K, m0, n0, [&](int r, int k) { return x[(size_t)r * K + k]; },
            [&](int k, int o) { return W[(size_t)o * K + k]; },
            [&](int r, int o, float acc) {
                const float v = bias ? acc + bias[o] : acc;
                y[(size_t)r * N + o] = v;
                logits[(r - m0) * LINEAR_CROSS_ENTROPY_CLASSES + o] = v;
            },
            smem);
    }
}

// Rows a block of nn_linear_cross_entropy_tiny takes (src/nn/cuda/mod.rs's logit_block_rows; a test reads it).
constexpr int LOGIT_ROWS = 2;

// The rows [m0, m0 + ROWS) of y = x·Wᵀ + b as logits_by_tiles<T> forms them, its KSPLIT thread groups splitting
// k, to the bit, but with every group's sums in flight at once: a thread takes a group g and an output o
// and forms, for each of the rows, the group's fmaf chain over k ≡ g (mod KSPLIT) from k = g up (gemm_tile's
// group g walks its k so, chunk after chunk, as BK is a multiple of KSPLIT); the groups' sums are then added in
// order from group 0, and the bias after. A warp reads 16 consecutive k of x's rows and of two W rows a step,
// sixteen steps ahead of its sums. (The tiny tile's block walked K in chunks of 256, a barrier and a round
// trip to memory each: the ResNet example's head, 128 rows × 10 over 3,136 inputs in 16 blocks, took 21.4
// µs; with four steps ahead, 38.5 µs in 64 blocks.)
template <class T, int ROWS>
__device__ __forceinline__ void logits_by_groups(const float* __restrict__ x, const float* __restrict__ W,
                                                 const float* __restrict__ bias, float* __restrict__ y, float* logits,
                                                 int R, int N, int K, int m0) {
    constexpr int KSPLIT = GemmTile<T::BM, T::BN, T::BK, T::TM, T::TN>::KSPLIT;
    static_assert(T::BK % KSPLIT == 0 && THREADS % KSPLIT == 0, "a group's k ≡ g (mod KSPLIT) in every chunk");
    constexpr int AHEAD = 16;  // k a thread loads before it adds them: the chain waits on one load in 16
    __shared__ float part[KSPLIT * ROWS * LINEAR_CROSS_ENTROPY_CLASSES];  // [g][row][o]
    const int rows = min(ROWS, R - m0), g = threadIdx.x % KSPLIT;
    for (int o = threadIdx.x / KSPLIT; o < N; o += THREADS / KSPLIT) {
        const float* w = W + (size_t)o * K;
        const float* xs = x + (size_t)m0 * K;
        float acc[ROWS] = {};
        for (int k0 = g; k0 < K; k0 += KSPLIT * AHEAD) {
            float wk[AHEAD], xk[ROWS][AHEAD];
#pragma unroll
            for (int j = 0; j < AHEAD; ++j) {
                const int k = k0 + j * KSPLIT;
                wk[j] = k < K ? w[k] : 0.0f;
#pragma unroll
                for (int r = 0; r < ROWS; ++r) xk[r][j] = k < K && r < rows ? xs[(size_t)r * K + k] : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < AHEAD; ++j) {
                if (k0 + j * KSPLIT >= K) break;
#pragma unroll
                for (int r = 0; r < ROWS; ++r) acc[r] = fmaf(xk[r][j], wk[j], acc[r]);
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) part[(g * ROWS + r) * LINEAR_CROSS_ENTROPY_CLASSES + o] = acc[r];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < rows * N; i += THREADS) {
        const int r = i / N, o = i - r * N;
        float sum = part[r * LINEAR_CROSS_ENTROPY_CLASSES + o];
#pragma unroll
        for (int gg = 1; gg < KSPLIT; ++gg) sum += part[(gg * ROWS + r) * LINEAR_CROSS_ENTROPY_CLASSES + o];
        const float v = bias ? sum + bias[o] : sum;
        y[(size_t)(m0 + r) * N + o] = v;
        logits[r * LINEAR_CROSS_ENTROPY_CLASSES + o] = v;
    }
}

// The rest of nn_linear_cross_entropy once a block's BM rows of logits (from m0) are in `logits`: their
// cross-entropy, dx where asked, and the mean by the last block.
template <int BM>
__device__ __forceinline__ void cross_entropy_of_logits(float* logits, const float* __restrict__ x,
                                                        const float* __restrict__ W, int R, int N, int K, int m0,
                                                        const float* __restrict__ targets, float* __restrict__ loss,
                                                        float* __restrict__ d, float* __restrict__ counted,
                                                        float ignore, float row_scale, float* __restrict__ mean,
                                                        float* __restrict__ count, float* __restrict__ one,
                                                        unsigned* __restrict__ ticket, float* __restrict__ dx,
                                                        const float* __restrict__ act_pre, int act, int dx_ksplit) {
    __syncthreads();
    if (row_scale == LINEAR_CROSS_ENTROPY_COUNT_ROWS) row_scale = 1.0f / rows_not_ignored(targets, R, ignore);
    for (int row = m0 + threadIdx.x / 32; row < min(m0 + BM, R); row += WARPS) {
        float row_loss, row_counted;
        cross_entropy_row(logits + (row - m0) * LINEAR_CROSS_ENTROPY_CLASSES, d + (size_t)row * N, targets[row], N,
                          ignore, row_scale, row_loss, row_counted);
        if (threadIdx.x % 32 == 0) loss[row] = row_loss, counted[row] = row_counted;
    }
    if (dx) {
        // The layer's dx = d·W for the block's rows, times the slope of the activation that made x
        // (act_pre): d's rows take the logits' place in shared memory, and linear_dx_rows forms each element
        // as nn_linear_grad's dx tile of dx_ksplit thread groups sums it.
        const int rows = min(BM, R - m0);
        __syncthreads();
        for (int i = threadIdx.x; i < rows * N; i += THREADS)
            logits[i / N * LINEAR_CROSS_ENTROPY_CLASSES + i % N] = d[(size_t)(m0 + i / N) * N + i % N];
        __syncthreads();
        switch (dx_ksplit) {
            case 1: linear_dx_rows<1, BM>(logits, W, x, act_pre, act, dx, m0, rows, N, K); break;
            case 4: linear_dx_rows<4, BM>(logits, W, x, act_pre, act, dx, m0, rows, N, K); break;
            default: linear_dx_rows<16, BM>(logits, W, x, act_pre, act, dx, m0, rows, N, K); break;
        }
    }
    cross_entropy_mean(loss, counted, R, mean, count, one, ticket);
}

// The kernels: the large and small tiles' blocks take BM rows and form their logits by tiles
// (logits_by_tiles); the tiny tile's take LOGIT_ROWS rows and form them by groups (logits_by_groups), the same
// sums.
#define NN_LINEAR_CROSS_ENTROPY(SUFFIX, ROWS, FORM_LOGITS)                                                     \
    extern "C" __global__ void __launch_bounds__(THREADS) nn_linear_cross_entropy_##SUFFIX(                   \
        const float* __restrict__ x, const float* __restrict__ W, const float* __restrict__ bias,              \
        float* __restrict__ y, int K, const float* __restrict__ targets, float* __restrict__ loss,              \
        float* __restrict__ d, float* __restrict__ counted, int R, int N, float ignore, float row_scale,       \
        float* __restrict__ mean, float* __restrict__ count, float* __restrict__ one,                          \
        unsigned* __restrict__ ticket, float* __restrict__ dx, const float* __restrict__ act_pre, int act,      \
        int dx_ksplit) {                                                                                       \
        begin_after_previous_grid();                                                                           \
        __shared__ float logits[(ROWS) * LINEAR_CROSS_ENTROPY_CLASSES]; /* the block's rows */                \
        const int m0 = blockIdx.x * (ROWS);                                                                    \
        FORM_LOGITS(x, W, bias, y, logits, R, N, K, m0);                                                       \
        cross_entropy_of_logits<ROWS>(logits, x, W, R, N, K, m0, targets, loss, d, counted, ignore, row_scale, \
                                      mean, count, one, ticket, dx, act_pre, act, dx_ksplit);                  \
    }
NN_LINEAR_CROSS_ENTROPY(large, TileLarge::BM, logits_by_tiles<TileLarge>)
NN_LINEAR_CROSS_ENTROPY(small, TileSmall::BM, logits_by_tiles<TileSmall>)
NN_LINEAR_CROSS_ENTROPY(tiny, LOGIT_ROWS, (logits_by_groups<TileTiny, LOGIT_ROWS>))
#undef NN_LINEAR_CROSS_ENTROPY

// out = saved · (1 / divisor[0]) · (scale · upstream[0]) (divisor null: 1): a loss's saved gradient over the
// rows it averaged, times the gradient that reached the loss. Saved times 1/divisor first: the bits of
// nn_linear_cross_entropy's d when it counts the rows itself (LINEAR_CROSS_ENTROPY_COUNT_ROWS), so that a
// backward from it (saved = d, no divisor) gives the same bits as from the unfused one. A divisor of 0 (every
// row ignored, every saved value 0) gives 0, as PyTorch's gradient and the fused d, not 0 · ∞.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_scale_by(const float* __restrict__ saved, const float* __restrict__ upstream, const float* __restrict__ divisor,
            float scale, float* __restrict__ out, int n) {
    begin_after_previous_grid();
    const float per_row = divisor ? (divisor[0] > 0.0f ? 1.0f / divisor[0] : 0.0f) : 1.0f;
    const float factor = scale * upstream[0];
    for (int i = grid_index(); i < n; i += grid_stride()) out[i] = saved[i] * per_row * factor;
}

// out[i] = value: a backward's seed.
extern "C" __global__ void __launch_bounds__(THREADS) nn_fill(float* __restrict__ out, float value, int n) {
    begin_after_previous_grid();
    for (int i = grid_index(); i < n; i += grid_stride()) out[i] = value;
}

// ---- optimizer and clip_grad_norm: many tensors a launch ----
//
// As PyTorch's multi_tensor_apply: a table of tensors passed by value as the first kernel parameter (with
// the others at most 4 KB; a longer list takes several launches), each tensor cut into chunks of
// UPDATE_CHUNK elements (the update) or TENSOR_CHUNK (the clip), one block per (tensor, chunk). first_block[k] is tensor k's first block (a prefix
// sum; first_block[count] is the grid's size), so a tensor of no element has no block. The chunk size is a
// constant, not a function of the GPU, so the clip's partial sums, and the norm, repeat on any GPU.
// Host side: src/nn/cuda/optim.rs, which builds the tables in this layout.

constexpr int TENSOR_CHUNK = 8192;
// The update's chunks are smaller: its elements are independent, and a thread walking 32 of them, each
// waiting on four loads, kept a 100k-parameter model's update at 40 µs.
constexpr int UPDATE_CHUNK = 1024;
static_assert(UPDATE_CHUNK % THREADS == 0, "a chunk is a whole number of elements a thread");
constexpr int UPDATE_TABLE_TENSORS = 64;
constexpr int CHUNK_TABLE_TENSORS = 128;

// The tensors of one optimizer launch: each parameter θ with its gradient, state and group's settings.
struct UpdateTable {
    float* theta[UPDATE_TABLE_TENSORS];
    const float* grad[UPDATE_TABLE_TENSORS];
    float* m[UPDATE_TABLE_TENSORS];      // null when the kind keeps no m
    float* v[UPDATE_TABLE_TENSORS];      // null when the kind keeps no v
    float* steps[UPDATE_TABLE_TENSORS];  // the parameter's step count (one float), advanced by nn_count_steps
    int n[UPDATE_TABLE_TENSORS];
    float lr_scale[UPDATE_TABLE_TENSORS];
    float weight_decay[UPDATE_TABLE_TENSORS];
    int first_block[UPDATE_TABLE_TENSORS + 1];
    int count;
};

// The gradients of one clip launch: each read from x; nn_scale_chunks writes x times the factor, `times`
// times over (a tensor listed that often), to out (x itself, or a new buffer).
struct ChunkTable {
    const float* x[CHUNK_TABLE_TENSORS];
    float* out[CHUNK_TABLE_TENSORS];
    int n[CHUNK_TABLE_TENSORS];
    int times[CHUNK_TABLE_TENSORS];
    int first_block[CHUNK_TABLE_TENSORS + 1];
    int count;
};

// The tensor that block `block` works on: the last k with first_block[k] <= block (a binary search). The
// kernels take their table `const __grid_constant__`, so reading it by address stays in the parameter
// space (no copy to local memory).
template <class Table>
__device__ __forceinline__ int table_tensor(const Table& table, int block) {
    int lo = 0, hi = table.count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (table.first_block[mid] <= block)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// This block's elements [begin, end) of tensor k: its chunk.
template <int CHUNK, class Table>
__device__ __forceinline__ void table_chunk(const Table& table, int k, int& begin, int& end) {
    const int n = table.n[k];
    begin = ((int)blockIdx.x - table.first_block[k]) * CHUNK;
    end = n - begin < CHUNK ? n : begin + CHUNK;
}

// steps[0] += 1 for every tensor of the table: the step counts, kept on the device (exact to 2^24 steps).
__device__ __forceinline__ void count_steps(const UpdateTable& table) {
    for (int k = threadIdx.x; k < table.count; k += THREADS) table.steps[k][0] += 1.0f;
}

// count_steps alone, for a table whose tensors have no element (nn_update_tensors then has no block).
extern "C" __global__ void __launch_bounds__(THREADS) nn_count_steps(const __grid_constant__ UpdateTable table) {
    begin_after_previous_grid();
    count_steps(table);
}

// One optimizer step of every tensor of the table (optim.cuh's update, as one tensor's own launch would do
// it): rate base_lr[0]·lr_scale and Adam's bias corrections from the tensor's step count, both read from
// device memory, so a captured step replays with the rate and counts of each replay. A block per chunk.
// Each block takes this step's number as its tensor's count + 1; the last block to finish (`ticket`, left at
// 0) then advances the counts, once every block has read them.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_update_tensors(const __grid_constant__ UpdateTable table, int kind, const float* __restrict__ base_lr,
                  float momentum, float beta1, float beta2, float eps, float grad_scale, unsigned* __restrict__ ticket) {
    begin_after_previous_grid();
    const int k = table_tensor(table, blockIdx.x);
    int begin, end;
    table_chunk<UPDATE_CHUNK>(table, k, begin, end);
    // Every element's loads first, then the step's scalars (Adam's corrections are a double pow), then
    // optim.cuh's update of each element: optim_update_range's loop would wait on each element in turn.
    constexpr int EACH = UPDATE_CHUNK / THREADS;
    float* theta = table.theta[k];
    const float* grad = table.grad[k];
    float *m = table.m[k], *v = table.v[k];
    float th[EACH], g[EACH], mi[EACH], vi[EACH];
#pragma unroll
    for (int j = 0; j < EACH; ++j) {
        const int i = begin + threadIdx.x + j * THREADS;
        const bool inside = i < end;
        th[j] = inside ? theta[i] : 0.0f;
        g[j] = inside ? grad[i] : 0.0f;
        mi[j] = inside && m ? m[i] : 0.0f;
        vi[j] = inside && v ? v[i] : 0.0f;
    }
    OptimStep s{kind, base_lr[0] * table.lr_scale[k], momentum, beta1, beta2, eps, table.weight_decay[k],
                grad_scale, 1.0f, 1.0f};
    optim_bias_corrections(s, (unsigned)table.steps[k][0] + 1u);
#pragma unroll
    for (int j = 0; j < EACH; ++j) {
        const int i = begin + threadIdx.x + j * THREADS;
        if (i >= end) break;
        theta[i] = optim_update(s, th[j], g[j], mi[j], vi[j]);
        if (m) m[i] = mi[j];
        if (v) v[i] = vi[j];
    }
    if (!last_block_to_finish(ticket)) return;
    count_steps(table);
    if (threadIdx.x == 0) ticket[0] = 0;
}

// partials[first_slot + b] = Σ x² over block b's chunk: each thread its elements in order, then a fixed
// tree (clip_grad_norm's first pass, a slot per (gradient, chunk) in the order of the list).
extern "C" __global__ void __launch_bounds__(THREADS)
nn_sum_squares_chunks(const __grid_constant__ ChunkTable table, float* __restrict__ partials, int first_slot) {
    begin_after_previous_grid();
    __shared__ float scratch[WARPS];
    const int k = table_tensor(table, blockIdx.x);
    int begin, end;
    table_chunk<TENSOR_CHUNK>(table, k, begin, end);
    const float* x = table.x[k];
    float s = 0.0f;
    for (int i = begin + threadIdx.x; i < end; i += THREADS) s += x[i] * x[i];
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) partials[first_slot + blockIdx.x] = s;
}

// norm[0] = √(Σ squares[0..count)) and factor[0] = max_norm / norm when the norm is above max_norm, else 1
// (ops::optim::clip_scale): the global norm clip_grad_norm scales every gradient by. One block, in f64:
// thread t adds slots t, t + THREADS, … in order, then a fixed tree over the threads.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_clip_factor(const float* __restrict__ squares, int count, float max_norm, float* __restrict__ norm,
               float* __restrict__ factor) {
    begin_after_previous_grid();
    __shared__ double scratch[WARPS];
    double total = 0.0;
    for (int i = threadIdx.x; i < count; i += THREADS) total += (double)squares[i];
    total = block_combine(total, scratch, 0.0, [](double x) {
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(FULL_MASK, x, offset);
        return x;
    });
    if (threadIdx.x == 0) {
        const float n = (float)sqrt(total);
        norm[0] = n;
        factor[0] = n > max_norm ? max_norm / n : 1.0f;
    }
}

// out = factor[0]·x, `times` times over, for every gradient of the table (the clip's second pass; x and out
// may be one buffer: each element is read, then written, by one thread).
extern "C" __global__ void __launch_bounds__(THREADS)
nn_scale_chunks(const __grid_constant__ ChunkTable table, const float* __restrict__ factor) {
    begin_after_previous_grid();
    const int k = table_tensor(table, blockIdx.x);
    int begin, end;
    table_chunk<TENSOR_CHUNK>(table, k, begin, end);
    const float f = factor[0];
    const float* x = table.x[k];
    float* out = table.out[k];
    const int times = table.times[k];
    for (int i = begin + threadIdx.x; i < end; i += THREADS) {
        float g = x[i];
        for (int t = 0; t < times; ++t) g = f * g;
        out[i] = g;
    }
}

// ---- the weight gradients of several linear layers in one launch ----
//
// The backward defers each linear layer's nn_linear_grad_weight (its dW and db: read by nothing but the
// optimizer) until the next launch; when two or more wait, they go as one launch of this kernel, a table of
// jobs as the optimizer's: a block per tile of every job, each job in the tile its own launch would take,
// so each gradient has its own launch's bits. A small model's layers then take one launch's time for their
// weight gradients, not one each. Host side: src/nn/cuda/weight_grads.rs.
constexpr int WEIGHT_GRAD_TABLE_JOBS = 8;

struct WeightGradTable {
    const float* dy[WEIGHT_GRAD_TABLE_JOBS];
    const float* x[WEIGHT_GRAD_TABLE_JOBS];
    float* dW[WEIGHT_GRAD_TABLE_JOBS];
    float* db[WEIGHT_GRAD_TABLE_JOBS];  // null when the layer has no bias
    int rows[WEIGHT_GRAD_TABLE_JOBS];
    int outputs[WEIGHT_GRAD_TABLE_JOBS];
    int inputs[WEIGHT_GRAD_TABLE_JOBS];
    int tile[WEIGHT_GRAD_TABLE_JOBS];  // 0 TileLarge, 1 TileSmall, 2 TileTiny
    int first_block[WEIGHT_GRAD_TABLE_JOBS + 1];
    int count;
};

// Job k's tile `block` (of its ⌈N/BM⌉·⌈(K + 1)/BN⌉, row by row) in tile T.
template <class T>
__device__ __forceinline__ void weight_grad_job(const WeightGradTable& table, int k, int block, float* smem) {
    const int N = table.outputs[k], K = table.inputs[k];
    const int columns = (K + (table.db[k] ? 1 : 0) + T::BN - 1) / T::BN;
    linear_grad_weight_tile<T>(table.dy[k], table.x[k], table.dW[k], table.db[k], table.rows[k], N, K,
                               block / columns * T::BM, block % columns * T::BN, smem);
}

// Grid: first_block[count] blocks; dynamic shared memory the largest of the jobs' tiles'.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_linear_grad_weights(const __grid_constant__ WeightGradTable table) {
    begin_after_previous_grid();
    extern __shared__ float smem[];
    const int k = table_tensor(table, blockIdx.x), block = blockIdx.x - table.first_block[k];
    switch (table.tile[k]) {
        case 0: weight_grad_job<TileLarge>(table, k, block, smem); break;
        case 1: weight_grad_job<TileSmall>(table, k, block, smem); break;
        default: weight_grad_job<TileTiny>(table, k, block, smem); break;
    }
}

// ---- layers: LayerNorm, embedding, dropout, attention ----

// The warp of row `row` of `rows` (a warp per row, WARPS rows a block), or -1 past the last row.
__device__ __forceinline__ int warp_row(int rows) {
    const int row = blockIdx.x * WARPS + threadIdx.x / 32;
    return row < rows ? row : -1;
}

// out[i] = Σ_u w[u]·rows[u·D + i] over u < keys (u from 0 up), the warp's lanes taking i: attention's
// weighted sum of value rows, and of key rows for dq.
__device__ __forceinline__ void warp_weighted_rows(const float* w, const float* rows, int keys, int D, float* out) {
    for (int i = threadIdx.x % 32; i < D; i += 32) {
        float acc = 0.0f;
        for (int u = 0; u < keys; ++u) acc += w[u] * rows[(size_t)u * D + i];
        out[i] = acc;
    }
}

// LayerNorm of `rows` rows of D (CPU twin: ops::layernorm::layer_norm_eps): μ = Σx / D, σ² = Σ(x − μ)² / D,
// r = 1/√(σ² + eps), y = (x − μ)·r·w + b, w and b optional (null: 1 and 0). A warp per row; lane 0 keeps μ
// and r for the backward. Fused forms (capture-time fusion, src/nn/cuda/fusion.rs): with x2, the rows
// normalized are x + x2, written to s first (a residual add and the norm that reads it, one launch); with
// y16, y's bf16 copy too (the operand of the product that reads y).
extern "C" __global__ void __launch_bounds__(THREADS)
nn_layer_norm(const float* __restrict__ x, const float* __restrict__ x2, float* s, const float* __restrict__ w,
              const float* __restrict__ b, float* __restrict__ y, bf16* __restrict__ y16, float* __restrict__ mean,
              float* __restrict__ rstd, int rows, int D, float eps) {
    begin_after_previous_grid();
    const int row = warp_row(rows), lane = threadIdx.x % 32;
    if (row < 0) return;
    const size_t base = (size_t)row * D;
    float sum = 0.0f;
    if (x2) {
        for (int j = lane; j < D; j += 32) {
            const float v = x[base + j] + x2[base + j];
            s[base + j] = v;
            sum += v;
        }
    } else {
        for (int j = lane; j < D; j += 32) sum += x[base + j];
    }
    // Each lane reads back only the elements it wrote.
    const float* in = (x2 ? s : x) + base;
    const float mu = warp_sum(sum) / (float)D;
    float squares = 0.0f;
    for (int j = lane; j < D; j += 32) {
        const float c = in[j] - mu;
        squares += c * c;
    }
    const float r = 1.0f / sqrtf(warp_sum(squares) / (float)D + eps);
    for (int j = lane; j < D; j += 32) {
        const float normalized = (in[j] - mu) * r;
        const float out = (w ? normalized * w[j] : normalized) + (b ? b[j] : 0.0f);
        y[base + j] = out;
        if (y16) y16[base + j] = to_bf16(out);
    }
    if (lane == 0) {
        mean[row] = mu;
        rstd[row] = r;
    }
}

// LayerNorm's dx, a warp per row (layernorm.cuh's formula at run-time D): x̂ = (x − μ)·r, g = dy·w,
// dx = r·(g − mean(g) − x̂·mean(g·x̂)). g is rounded before it is used (__fmul_rn, never fused into the
// subtraction that follows), so g − mean(g) is exactly 0 where the row has one element, as on the host.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_layer_norm_grad(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ mean,
                   const float* __restrict__ rstd, const float* __restrict__ dy, float* __restrict__ dx, int rows,
                   int D) {
    begin_after_previous_grid();
    const int row = warp_row(rows), lane = threadIdx.x % 32;
    if (row < 0) return;
    const size_t base = (size_t)row * D;
    const float mu = mean[row], r = rstd[row];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int j = lane; j < D; j += 32) {
        const float g = w ? __fmul_rn(dy[base + j], w[j]) : dy[base + j];
        sum_g += g;
        sum_gx += g * ((x[base + j] - mu) * r);
    }
    sum_g = warp_sum(sum_g) / (float)D;
    sum_gx = warp_sum(sum_gx) / (float)D;
    for (int j = lane; j < D; j += 32) {
        const float g = w ? __fmul_rn(dy[base + j], w[j]) : dy[base + j];
        const float xhat = (x[base + j] - mu) * r;
        dx[base + j] = r * (g - sum_g - xhat * sum_gx);
    }
}

// LayerNorm's weight and bias gradients, in parts of rows_per_part rows: dw[p·D + c] = Σ_r dy[r, c]·x̂[r, c]
// and db[p·D + c] = Σ_r dy[r, c] over part p's rows from its first up, a thread per (part, column) (either
// output may be null). The launch layer adds the parts in order (nn_sum_axis); one part is the whole sum.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_layer_norm_grad_affine(const float* __restrict__ x, const float* __restrict__ mean,
                          const float* __restrict__ rstd, const float* __restrict__ dy, float* __restrict__ dw,
                          float* __restrict__ db, int rows, int D, int rows_per_part) {
    begin_after_previous_grid();
    const int parts = (rows + rows_per_part - 1) / rows_per_part;
    for (int e = grid_index(); e < parts * D; e += grid_stride()) {
        const int part = e / D, c = e % D, end = min(rows, (part + 1) * rows_per_part);
        float sum_w = 0.0f, sum_b = 0.0f;
        for (int r = part * rows_per_part; r < end; ++r) {
            const size_t i = (size_t)r * D + c;
            sum_w += dy[i] * ((x[i] - mean[r]) * rstd[r]);
            sum_b += dy[i];
        }
        if (dw) dw[e] = sum_w;
        if (db) db[e] = sum_b;
    }
}

// out[p·D + c] = weight[ids[p]·D + c] for `count` ids (each already checked to be a row).
extern "C" __global__ void __launch_bounds__(THREADS)
nn_embedding(const float* __restrict__ weight, const int* __restrict__ ids, float* __restrict__ out, int count,
             int D) {
    begin_after_previous_grid();
    const int n = count * D;
    for (int e = grid_index(); e < n; e += grid_stride()) out[e] = weight[(size_t)ids[e / D] * D + e % D];
}

// The embedding weight's gradient, V rows of D: dw[v·D + c] = Σ dy[positions[k]·D + c] over k from
// starts[v] to starts[v + 1] (the positions whose id is v, ascending; the host leaves the padding row's
// out), a thread per element: a fixed order, no atomics.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_embedding_grad(const int* __restrict__ starts, const int* __restrict__ positions, const float* __restrict__ dy,
                  float* __restrict__ dw, int V, int D) {
    begin_after_previous_grid();
    const int n = V * D;
    for (int e = grid_index(); e < n; e += grid_stride()) {
        const int v = e / D, c = e % D;
        float sum = 0.0f;
        for (int k = starts[v]; k < starts[v + 1]; ++k) sum += dy[(size_t)positions[k] * D + c];
        dw[e] = sum;
    }
}

// nn_embedding with the ids in device memory, held as floats (a captured step reads each replay's): an id
// that is not a whole number in 0..V gives a row of NaN, never another row.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_embedding_ids(const float* __restrict__ weight, const float* __restrict__ ids, float* __restrict__ out, int count,
                 int V, int D) {
    begin_after_previous_grid();
    const int n = count * D;
    for (int e = grid_index(); e < n; e += grid_stride()) {
        const float id = ids[e / D];
        const bool row = id >= 0.0f && id < (float)V && id == floorf(id);
        out[e] = row ? weight[(size_t)id * D + e % D] : __int_as_float(0x7fc00000);
    }
}

// nn_embedding_grad for ids in device memory, over parts of the positions: parts[q·V·D + v·D + c] = Σ
// dy[p·D + c] over the positions p of part q (p in [q·per_part, (q + 1)·per_part)) whose id is v, p from
// the part's first up; 0 for the row `padding` (−1: none). The launch layer adds the parts in order. A
// thread per (part, element) scans its part's ids: O(V·D·count) reads of the ids (broadcast across a
// warp), cheap for the vocabularies of characters and positions, and no list to build on the host; the
// parts give every SM threads (a thread per element alone walked all 16k ids of a nanoGPT batch).
extern "C" __global__ void __launch_bounds__(THREADS)
nn_embedding_ids_grad(const float* __restrict__ ids, const float* __restrict__ dy, float* __restrict__ parts,
                      int count, int V, int D, int padding, int per_part, int part_count) {
    begin_after_previous_grid();
    const int n = V * D;
    for (long long e = grid_index(); e < (long long)part_count * n; e += grid_stride()) {
        const int q = (int)(e / n), v = (int)(e % n) / D, c = (int)(e % n) % D;
        const int end = min(count, (q + 1) * per_part);
        float sum = 0.0f;
        if (v != padding)
            for (int p = q * per_part; p < end; ++p)
                if (ids[p] == (float)v) sum += dy[(size_t)p * D + c];
        parts[e] = sum;
    }
}

// y[i] = x[i]·(scale or 0) by dropout.cuh's mask of element i under `key` (the site's key of the step,
// computed by the host); the backward is the same kernel on the gradient. scale 0 zeroes everything (p = 1).
extern "C" __global__ void __launch_bounds__(THREADS)
nn_dropout(const float* __restrict__ x, float* __restrict__ y, int n, unsigned key, unsigned threshold, float scale) {
    begin_after_previous_grid();
    for (int i = grid_index(); i < n; i += grid_stride())
        y[i] = x[i] * dropout_factor(key, (unsigned)i, threshold, scale);
}

// key[0] = the site's key in this step, dropout_key(site_seed, step), and step[0] += 1: a Dropout layer's
// step counter lives on the device, so each replay of a captured step draws the next mask. One thread.
extern "C" __global__ void nn_dropout_draw(unsigned site_seed, unsigned* __restrict__ step, unsigned* __restrict__ key) {
    begin_after_previous_grid();
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        key[0] = dropout_key(site_seed, step);
        step[0] += 1u;
    }
}

// taken[0] = step[0], then step[0] += 1: a Dropout layer's step for a kernel that draws its mask from the
// site's seed and a step word itself (nn_attention.cu's dropout on the attention probabilities). One thread.
extern "C" __global__ void nn_take_step(unsigned* __restrict__ step, unsigned* __restrict__ taken) {
    begin_after_previous_grid();
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        taken[0] = step[0];
        step[0] += 1u;
    }
}

// nn_dropout with the key read from device memory (nn_dropout_draw's); forward and backward alike.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_dropout_keyed(const float* __restrict__ x, float* __restrict__ y, int n, const unsigned* __restrict__ key,
                 unsigned threshold, float scale) {
    begin_after_previous_grid();
    const unsigned k = key[0];
    for (int i = grid_index(); i < n; i += grid_stride()) y[i] = x[i] * dropout_factor(k, (unsigned)i, threshold, scale);
}

// Attention of q, k, v [B, H, T, D], a warp per query row (b, h, t) of rows = B·H·T (CPU twin:
// ops::attention::sdp_attention): p_u = softmax_u(q_t·k_u·scale) over the keys u < keys (t + 1 when causal,
// else T), y_t = Σ_u p_u·v_u (u from 0 up). P [rows, T] keeps the probabilities (0 past the last key) for
// the backward.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_attention(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
             float* __restrict__ y, float* P, int rows, int T, int D, float scale, int causal) {
    begin_after_previous_grid();
    const int row = warp_row(rows), lane = threadIdx.x % 32;
    if (row < 0) return;
    const int t = row % T, keys = causal ? t + 1 : T;
    const size_t head = (size_t)(row - t) * D;  // (b, h, 0, 0)
    const float* qt = q + (size_t)row * D;
    float* p = P + (size_t)row * T;
    float m = NEG_INF;
    for (int u = lane; u < keys; u += 32) {
        const float* ku = k + head + (size_t)u * D;
        float s = 0.0f;
        for (int i = 0; i < D; ++i) s += qt[i] * ku[i];
        s *= scale;
        p[u] = s;
        m = fmaxf(m, s);
    }
    m = warp_max(m);
    float sum = 0.0f;
    for (int u = lane; u < keys; u += 32) {
        const float e = expf(p[u] - m);
        p[u] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    for (int u = lane; u < T; u += 32) p[u] = u < keys ? p[u] / sum : 0.0f;
    __syncwarp();  // every lane reads every p_u below
    warp_weighted_rows(p, v + head, keys, D, y + (size_t)row * D);
}

// Attention's backward for query row (b, h, t), a warp per row: dP_u = dy_t·v_u, G_u = P_u·(dP_u −
// Σ_u' P_u'·dP_u')·scale (the scores' gradient times scale; 0 past the last key), kept in G [rows, T] for
// nn_attention_grad_kv, and dq_t = Σ_u G_u·k_u (u from 0 up).
extern "C" __global__ void __launch_bounds__(THREADS)
nn_attention_grad_q(const float* __restrict__ k, const float* __restrict__ v, const float* __restrict__ P,
                    const float* __restrict__ dy, float* G, float* __restrict__ dq, int rows, int T, int D,
                    float scale, int causal) {
    begin_after_previous_grid();
    const int row = warp_row(rows), lane = threadIdx.x % 32;
    if (row < 0) return;
    const int t = row % T, keys = causal ? t + 1 : T;
    const size_t head = (size_t)(row - t) * D;
    const float* dyt = dy + (size_t)row * D;
    const float* p = P + (size_t)row * T;
    float* g = G + (size_t)row * T;
    float dot = 0.0f;
    for (int u = lane; u < keys; u += 32) {
        const float* vu = v + head + (size_t)u * D;
        float dp = 0.0f;
        for (int i = 0; i < D; ++i) dp += dyt[i] * vu[i];
        g[u] = dp;
        dot += p[u] * dp;
    }
    dot = warp_sum(dot);
    for (int u = lane; u < T; u += 32) g[u] = u < keys ? p[u] * (g[u] - dot) * scale : 0.0f;
    __syncwarp();  // every lane reads every G_u below
    warp_weighted_rows(g, k + head, keys, D, dq + (size_t)row * D);
}

// dk and dv of key element (b, h, u, i), a thread each of n = B·H·T·D: dk = Σ_t G[t, u]·q_t[i], dv =
// Σ_t P[t, u]·dy_t[i] over the queries t that see key u (t ≥ u when causal), t from low to high.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_attention_grad_kv(const float* __restrict__ q, const float* __restrict__ P, const float* __restrict__ G,
                     const float* __restrict__ dy, float* __restrict__ dk, float* __restrict__ dv, int n, int T,
                     int D, int causal) {
    begin_after_previous_grid();
    for (int e = grid_index(); e < n; e += grid_stride()) {
        const int i = e % D, key_row = e / D, u = key_row % T;
        const size_t first = (size_t)(key_row - u);  // the row of (b, h, 0)
        float sum_k = 0.0f, sum_v = 0.0f;
        for (int t = causal ? u : 0; t < T; ++t) {
            const size_t r = first + t;
            sum_k += G[r * T + u] * q[r * D + i];
            sum_v += P[r * T + u] * dy[r * D + i];
        }
        dk[e] = sum_k;
        dv[e] = sum_v;
    }
}

// ---- shapes and images: narrow and cat, conv2d (im2col and col2im; implicit products), max_pool2d ----

// A run of indices along the middle axis of two tensors seen as (outer, ·, inner): to[(o, to_start + k, i)]
// = from[(o, from_start + k, i)] for k < len, the axis from_n long in `from` and to_n in `to`; count = outer ·
// len · inner, a thread per element copied. narrow's forward and cat's backward copy a piece out of the
// whole, cat's forward a piece into it.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_copy_run(const float* __restrict__ from, float* __restrict__ to, int count, int inner, int len, int from_n,
            int from_start, int to_n, int to_start) {
    begin_after_previous_grid();
    for (int e = grid_index(); e < count; e += grid_stride()) {
        const int i = e % inner, k = e / inner % len, o = e / inner / len;
        to[((size_t)o * to_n + to_start + k) * inner + i] = from[((size_t)o * from_n + from_start + k) * inner + i];
    }
}

// narrow's backward: dx (outer, n, inner) holds dy (outer, len, inner) at indices start..start + len of the
// middle axis and 0 elsewhere; count = outer · n · inner, a thread per element of dx.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_pad_run(const float* __restrict__ dy, float* __restrict__ dx, int count, int inner, int n, int start, int len) {
    begin_after_previous_grid();
    for (int e = grid_index(); e < count; e += grid_stride()) {
        const int i = e % inner, k = e / inner % n - start, o = e / inner / n;
        dx[e] = k >= 0 && k < len ? dy[((size_t)o * len + k) * inner + i] : 0.0f;
    }
}

// conv2d's im2col: col[t][s·P + p] = x[s][c][oy·stride + ky − padding][ox·stride + kx − padding] (0 in the
// padding) for the tap t = (c·KH + ky)·KW + kx and the position p = oy·OW + ox (P = OH·OW) of sample s, so
// that weight [O][C·KH·KW] · col is every sample's output at once, [O][samples·P]. count = C·KH·KW ·
// samples·P, a thread per element of col.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_im2col(const float* __restrict__ x, float* __restrict__ col, int count, int samples, int C, int H, int W, int KH,
          int KW, int stride, int padding, int OH, int OW) {
    begin_after_previous_grid();
    const int positions = OH * OW, columns = samples * positions;
    for (int e = grid_index(); e < count; e += grid_stride()) {
        const int column = e % columns, t = e / columns;
        const int s = column / positions, oy = column % positions / OW, ox = column % OW;
        const int kx = t % KW, ky = t / KW % KH, c = t / KW / KH;
        const int iy = oy * stride + ky - padding, ix = ox * stride + kx - padding;
        const bool inside = iy >= 0 && iy < H && ix >= 0 && ix < W;
        col[e] = inside ? x[(((size_t)s * C + c) * H + iy) * W + ix] : 0.0f;
    }
}

// The window positions o (along one axis) whose window holds input index i: o·stride − padding ≤ i <
// o·stride − padding + kernel, and o < windows. Empty when first > last.
__device__ __forceinline__ void windows_holding(int i, int kernel, int stride, int padding, int windows, int& first,
                                                int& last) {
    const int reach = i + padding - kernel + 1;  // the window must start at or after this
    first = reach > 0 ? ceil_div(reach, stride) : 0;
    last = min(windows - 1, (i + padding) / stride);
}

// conv2d's col2im, the input's gradient: dx[s][c][iy][ix] = Σ dcol[t][s·P + p] over the taps t = (c, ky, kx)
// and positions p = (oy, ox) that read that element (oy·stride + ky − padding = iy, and along the columns
// alike), ky then kx from 0 up. count = samples·C·H·W, a thread per input element.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_col2im(const float* __restrict__ dcol, float* __restrict__ dx, int count, int samples, int C, int H, int W,
          int KH, int KW, int stride, int padding, int OH, int OW) {
    begin_after_previous_grid();
    const int positions = OH * OW;
    const size_t columns = (size_t)samples * positions;
    for (int e = grid_index(); e < count; e += grid_stride()) {
        const int ix = e % W, iy = e / W % H, c = e / W / H % C, s = e / W / H / C;
        float sum = 0.0f;
        for (int ky = 0; ky < KH; ++ky) {
            const int row = iy + padding - ky;  // oy·stride
            if (row < 0 || row % stride != 0 || row / stride >= OH) continue;
            for (int kx = 0; kx < KW; ++kx) {
                const int column = ix + padding - kx;  // ox·stride
                if (column < 0 || column % stride != 0 || column / stride >= OW) continue;
                const size_t t = ((size_t)c * KH + ky) * KW + kx;
                sum += dcol[t * columns + (size_t)s * positions + row / stride * OW + column / stride];
            }
        }
        dx[e] = sum;
    }
}

// ---- conv2d as implicit products (fp32): the windows read where they lie, no col ----
// The same three products as im2col's, each staging its operands' chunks straight from the tensors (gemm_tile's
// functors), so no col of C·KH·KW × N·OH·OW floats is written or read, and the output and the gradients are
// stored in [N, C, H, W] order, so no gather puts them there:
//   forward       y[s][o][p] = Σ_t w[o][t] · window(t, s·P + p) + bias[o], t = (c·KH + ky)·KW + kx;
//   input grad    dx[s][c][q] = Σ_k w[o][c][ky][kx] · dy[s][o][oy][ox] over k = (o·KH + ky)·KW + kx, where
//                 oy·stride = iy + padding − ky (and ox alike; 0 where none is), q = iy·W + ix;
//   weight grad   dw[o][t] = Σ_n dy[o][n] · window(t, n) over the positions n = s·P + p, and db[o] = Σ_n
//                 dy[o][n] as a column of ones after the last tap: one product for both. A long n is cut
//                 into slices, a product each (blockIdx.y), whose results the launch layer adds in order.
// The index arithmetic divides by sizes known only at launch, so each divisor comes with its magic number
// (Divisor, made by src/nn/cuda/conv.rs): a multiply-high and a shift in place of a division.

// n / d for 0 ≤ n < 2³¹: ⌊n · mul / 2^(32 + shift)⌋, mul = ⌈2^(31 + ⌈log₂ d⌉) / d⌉, shift = ⌈log₂ d⌉ − 1 (d = 1:
// n itself; d = 0, a size nothing is divided by since nothing is indexed, has mul 0).
struct Divisor {
    int d;
    unsigned mul;
    unsigned shift;
};

__device__ __forceinline__ int divide(int n, Divisor v) {
    return v.d == 1 ? n : (int)(__umulhi((unsigned)n, v.mul) >> v.shift);
}

// The sizes of one convolution (ConvShape in src/nn/cuda/conv.rs): samples N, C×H×W in, O×OH×OW out, a
// KH×KW kernel; by_x divides by x (by_kernel_hw by KH·KW, by_positions by OH·OW, by_image by H·W).
struct ConvShape {
    int samples, channels, height, width, out_channels, kernel_h, kernel_w, stride, padding, out_h, out_w;
    Divisor by_kernel_w, by_kernel_hw, by_out_w, by_positions, by_width, by_image, by_stride;
};

// The window element of tap t at column n = s·P + p: x[s][c][oy·stride + ky − padding][ox·stride + kx −
// padding], 0 in the padding.
__device__ __forceinline__ float conv_window(const float* __restrict__ x, const ConvShape& v, int t, int n) {
    const int c = divide(t, v.by_kernel_hw), kk = t - c * v.by_kernel_hw.d;
    const int ky = divide(kk, v.by_kernel_w), kx = kk - ky * v.kernel_w;
    const int s = divide(n, v.by_positions), p = n - s * v.by_positions.d;
    const int oy = divide(p, v.by_out_w), ox = p - oy * v.out_w;
    const int iy = oy * v.stride + ky - v.padding, ix = ox * v.stride + kx - v.padding;
    const bool inside = iy >= 0 && iy < v.height && ix >= 0 && ix < v.width;
    return inside ? x[(((size_t)s * v.channels + c) * v.height + iy) * v.width + ix] : 0.0f;
}

// dy[s][o][oy][ox] for k = (o·KH + ky)·KW + kx and the input element n = (s·H + iy)·W + ix it reaches, 0
// where no window puts that tap on that element.
__device__ __forceinline__ float conv_reaching(const float* __restrict__ dy, const ConvShape& v, int k, int n) {
    const int o = divide(k, v.by_kernel_hw), kk = k - o * v.by_kernel_hw.d;
    const int ky = divide(kk, v.by_kernel_w), kx = kk - ky * v.kernel_w;
    const int s = divide(n, v.by_image), q = n - s * v.by_image.d;
    const int iy = divide(q, v.by_width), ix = q - iy * v.width;
    const int row = iy + v.padding - ky, column = ix + v.padding - kx;  // oy·stride, ox·stride
    if (row < 0 || column < 0) return 0.0f;
    const int oy = divide(row, v.by_stride), ox = divide(column, v.by_stride);
    if (oy * v.stride != row || ox * v.stride != column || oy >= v.out_h || ox >= v.out_w) return 0.0f;
    return dy[(((size_t)s * v.out_channels + o) * v.out_h + oy) * v.out_w + ox];
}

// How many taps a conv product lists in shared memory (ConvTap, after the product's own): with the list,
// an element's index is its column's base plus its tap's offset, and the bounds two compares; without it
// (more taps, or the input gradient at a stride above 1), each element divides its own indices.
constexpr int CONV_TAP_TABLE = 2048;

// One tap's part of an element's index: `offset`, added to the column's base; (ky, kx), for the bounds;
// `weight`, the weight element's offset (the input gradient's operand).
struct __align__(16) ConvTap {
    int offset, ky, kx, weight;
};

// The taps of the windows operand, t = (c·KH + ky)·KW + kx: offset (c·H + ky)·W + kx. Or, for the input
// gradient at stride 1, k = (o·KH + ky)·KW + kx: offset o·OH·OW − ky·OW − kx, weight o·C·KH·KW + ky·KW + kx.
// Every thread of the block takes part; a barrier ends it.
__device__ __forceinline__ void list_taps(ConvTap* __restrict__ table, const ConvShape& v, int count, bool reaching) {
    for (int t = threadIdx.x; t < count; t += THREADS) {
        const int outer = divide(t, v.by_kernel_hw), kk = t - outer * v.by_kernel_hw.d;
        const int ky = divide(kk, v.by_kernel_w), kx = kk - ky * v.kernel_w;
        table[t] = reaching ? ConvTap{outer * v.by_positions.d - ky * v.out_w - kx, ky, kx,
                                      outer * v.channels * v.by_kernel_hw.d + kk}
                            : ConvTap{(outer * v.height + ky) * v.width + kx, ky, kx, 0};
    }
    __syncthreads();
}

// The column part of a listed element's index, kept between one thread's calls: a thread stages one
// column's taps at a time (the forward's and the input gradient's products a column for the whole block,
// the weight gradient's a column a chunk), so it decodes a column once, not once an element. `base` plus a
// tap's offset is the element's index; (y0, x0) is the window's corner, or for the input gradient (iy +
// padding, ix + padding).
struct ConvColumn {
    int n = -1, base = 0, y0 = 0, x0 = 0;
};

// conv_window through the listed taps.
__device__ __forceinline__ float listed_window(const float* __restrict__ x, const ConvShape& v,
                                               const ConvTap* __restrict__ table, ConvColumn& column, int t, int n) {
    if (n != column.n) {
        const int s = divide(n, v.by_positions), p = n - s * v.by_positions.d;
        const int oy = divide(p, v.by_out_w), ox = p - oy * v.out_w;
        const int y0 = oy * v.stride - v.padding, x0 = ox * v.stride - v.padding;
        column = ConvColumn{n, (s * v.channels * v.height + y0) * v.width + x0, y0, x0};
    }
    const ConvTap tap = table[t];
    const bool inside =
        (unsigned)(column.y0 + tap.ky) < (unsigned)v.height && (unsigned)(column.x0 + tap.kx) < (unsigned)v.width;
    return inside ? x[column.base + tap.offset] : 0.0f;
}

// conv_reaching at stride 1 through the listed taps.
__device__ __forceinline__ float listed_reaching(const float* __restrict__ dy, const ConvShape& v,
                                                 const ConvTap* __restrict__ table, ConvColumn& column, int k, int n) {
    if (n != column.n) {
        const int s = divide(n, v.by_image), q = n - s * v.by_image.d;
        const int iy = divide(q, v.by_width), ix = q - iy * v.width;
        const int ry = iy + v.padding, rx = ix + v.padding;
        column = ConvColumn{n, s * v.out_channels * v.by_positions.d + ry * v.out_w + rx, ry, rx};
    }
    const ConvTap tap = table[k];
    const bool inside =
        (unsigned)(column.y0 - tap.ky) < (unsigned)v.out_h && (unsigned)(column.x0 - tap.kx) < (unsigned)v.out_w;
    return inside ? dy[column.base + tap.offset] : 0.0f;
}

// The listed taps, after the product's shared memory; null when there are more than CONV_TAP_TABLE.
template <class T>
__device__ __forceinline__ ConvTap* conv_taps(float* smem, const ConvShape& v, int count, bool reaching) {
    using G = GemmTile<T::BM, T::BN, T::BK, T::TM, T::TN>;
    static_assert(G::SHARED_FLOATS % 4 == 0, "the tap list must start 16 bytes aligned");
    if (count > CONV_TAP_TABLE) return nullptr;
    ConvTap* table = reinterpret_cast<ConvTap*>(smem + G::SHARED_FLOATS);
    list_taps(table, v, count, reaching);
    return table;
}

// Grid: (⌈N·P/BN⌉, ⌈O/BM⌉). bias may be null.
template <class T>
__device__ __forceinline__ void conv2d(const ConvShape& v, const float* __restrict__ x, const float* __restrict__ w,
                                       const float* __restrict__ bias, float* __restrict__ y) {
    extern __shared__ float smem[];
    const int taps = v.channels * v.by_kernel_hw.d, positions = v.by_positions.d;
    const ConvTap* table = conv_taps<T>(smem, v, taps, false);
    ConvColumn column;
    gemm_tile<T::BM, T::BN, T::BK, T::TM, T::TN, false, false>(
        v.out_channels, v.samples * positions, taps, blockIdx.y * T::BM, blockIdx.x * T::BN,
        [&](int o, int t) { return w[(size_t)o * taps + t]; },
        [&](int t, int n) { return table ? listed_window(x, v, table, column, t, n) : conv_window(x, v, t, n); },
        [&](int o, int n, float sum) {
            const int s = divide(n, v.by_positions), p = n - s * positions;
            y[((size_t)s * v.out_channels + o) * positions + p] = bias ? sum + bias[o] : sum;
        },
        smem);
}

// Grid: (⌈N·H·W/BN⌉, ⌈C/BM⌉).
template <class T>
__device__ __forceinline__ void conv2d_grad_input(const ConvShape& v, const float* __restrict__ dy,
                                                  const float* __restrict__ w, float* __restrict__ dx) {
    extern __shared__ float smem[];
    const int kernel_hw = v.by_kernel_hw.d, image = v.by_image.d, depth = v.out_channels * kernel_hw;
    const ConvTap* table = v.stride == 1 ? conv_taps<T>(smem, v, depth, true) : nullptr;
    ConvColumn column;
    gemm_tile<T::BM, T::BN, T::BK, T::TM, T::TN, false, false>(
        v.channels, v.samples * image, depth, blockIdx.y * T::BM, blockIdx.x * T::BN,
        [&](int c, int k) {
            if (table) return w[table[k].weight + (size_t)c * kernel_hw];
            const int o = divide(k, v.by_kernel_hw);
            return w[((size_t)o * v.channels + c) * kernel_hw + k - o * kernel_hw];
        },
        [&](int k, int n) {
            return table ? listed_reaching(dy, v, table, column, k, n) : conv_reaching(dy, v, k, n);
        },
        [&](int c, int n, float sum) {
            const int s = divide(n, v.by_image);
            dx[((size_t)s * v.channels + c) * image + n - s * image] = sum;
        },
        smem);
}

// Slice z = blockIdx.y / ⌈O/BM⌉ of the positions, [z·per_slice, min((z + 1)·per_slice, N·P)), into dw[z]
// [O][taps] and, when db is not null, db[z] [O]. Grid: (⌈(taps + 1)/BN⌉, ⌈O/BM⌉·slices).
template <class T>
__device__ __forceinline__ void conv2d_grad_weight(const ConvShape& v, const float* __restrict__ dy,
                                                   const float* __restrict__ x, float* __restrict__ dw,
                                                   float* __restrict__ db, int per_slice) {
    extern __shared__ float smem[];
    const int taps = v.channels * v.by_kernel_hw.d, positions = v.by_positions.d;
    const int row_tiles = (v.out_channels + T::BM - 1) / T::BM;
    const int z = blockIdx.y / row_tiles, first = z * per_slice;
    const int depth = min(per_slice, v.samples * positions - first);
    const ConvTap* table = conv_taps<T>(smem, v, taps, false);
    ConvColumn column;
    dw += (size_t)z * v.out_channels * taps;
    if (db) db += (size_t)z * v.out_channels;
    gemm_tile<T::BM, T::BN, T::BK, T::TM, T::TN, false, true>(
        v.out_channels, taps + (db ? 1 : 0), depth, blockIdx.y % row_tiles * T::BM, blockIdx.x * T::BN,
        [&](int o, int k) {
            const int n = first + k, s = divide(n, v.by_positions);
            return dy[((size_t)s * v.out_channels + o) * positions + n - s * positions];
        },
        [&](int k, int t) {
            if (t == taps) return 1.0f;
            return table ? listed_window(x, v, table, column, t, first + k) : conv_window(x, v, t, first + k);
        },
        [&](int o, int t, float sum) {
            if (t < taps) dw[(size_t)o * taps + t] = sum;
            else db[o] = sum;
        },
        smem);
}

// The conv products' tiles (CONV_TILES in src/nn/cuda/mod.rs), the one whose rows are the fewest that cover
// the output channels (or the input's, for the input gradient): 16 × 256, 32 × 128 and 64 × 64, 4 × 4 a thread.
using ConvTile16 = MatTile<16, 256, 8, 4, 4>;
using ConvTile32 = MatTile<32, 128, 8, 4, 4>;

#define NN_CONV_PRODUCTS(SUFFIX, TILE)                                                                         \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
    nn_conv2d_##SUFFIX(const ConvShape v, const float* __restrict__ x, const float* __restrict__ w,             \
                       const float* __restrict__ bias, float* __restrict__ y) {                                \
        begin_after_previous_grid();                                                                           \
        conv2d<TILE>(v, x, w, bias, y);                                                                        \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
    nn_conv2d_grad_input_##SUFFIX(const ConvShape v, const float* __restrict__ dy, const float* __restrict__ w, \
                                  float* __restrict__ dx) {                                                    \
        begin_after_previous_grid();                                                                           \
        conv2d_grad_input<TILE>(v, dy, w, dx);                                                                 \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
    nn_conv2d_grad_weight_##SUFFIX(const ConvShape v, const float* __restrict__ dy, const float* __restrict__ x, \
                                   float* __restrict__ dw, float* __restrict__ db, int per_slice) {             \
        begin_after_previous_grid();                                                                           \
        conv2d_grad_weight<TILE>(v, dy, x, dw, db, per_slice);                                                 \
    }
NN_CONV_PRODUCTS(16, ConvTile16)
NN_CONV_PRODUCTS(32, ConvTile32)
NN_CONV_PRODUCTS(64, TileLarge)
#undef NN_CONV_PRODUCTS

// ---- conv2d direct (fp32): a band of the image staged in shared memory ----
// Where a band of an image's rows fits in shared memory (src/nn/cuda/direct_conv.rs decides), the
// products above give way to kernels that stage the band once a block and read every window from it: no
// index divided per element, and each staged element serves every tap that reaches it.
//   forward     out[s][o][oy][ox] = Σ_c Σ_ky Σ_kx w[o][c][ky][kx] · in[s][c][oy·stride + ky − pad_y][ox·stride
//               + kx − pad_x] (+ bias[o]), the sum in that order. A block takes one sample, a band of
//               output rows and DIRECT_SPLIT·DIRECT_OUT output channels, the input channels `chunk` at a
//               time, its threads in DIRECT_SPLIT groups of DIRECT_OUT channels that share the staged band;
//               a thread one row's DIRECT_PX positions ox = g, g + G, g + 2G, g + 3G (G = ⌈OW/DIRECT_PX⌉,
//               so that neighbouring threads read neighbouring words), or side by side for 3×3 at stride 1
//               (`direct_packed`), times its group's channels.
//   input grad  at stride 1 the same sum over dy with the kernel flipped and its two channel axes
//               swapped (`flip`: w[c][o][KH − 1 − ky][KW − 1 − kx]), padding KH − 1 − p and KW − 1 − p.
//   weight grad dw[o][t] = Σ dy[s][o][oy][ox] · window(t) over one sample's band of positions in row-major
//               order, db[o] the same with a tap of ones after the last; a block takes GRAD_OUT output
//               channels and 4 taps a thread pair (at most DIRECT_TAPS), a thread 8 channels × 4 taps
//               L apart. Each block writes its band's sums to its own slice (s·bands + band),
//               which the launch layer adds in order.
constexpr int DIRECT_OUT = 8, DIRECT_SPLIT = 2, GRAD_OUT = 16, DIRECT_PX = 4, DIRECT_TAPS = 512;
constexpr int DIRECT_BLOCK_OUT = DIRECT_SPLIT * DIRECT_OUT;

// One direct convolution: the operand read through windows, `in` [N][in_channels][in_h][in_w] (x; dy for
// the input gradient), the result [N][out_channels][out_h][out_w] (y, dx; dy for the weight gradient), the
// band of band_rows output rows a block (bands = ⌈out_h / band_rows⌉), `chunk` input channels staged at a
// time in a tile of tile_h × tile_w elements each, whose (0, 0) is in[oy0·stride − pad_y][−pad_x], its rows
// `pitch` floats apart and its channels `plane` floats apart. The launch layer pads the pitches so that a
// warp's reads fall in distinct banks: a row pitch ≡ G (mod 32) in the forward, where a warp's threads are
// consecutive (row, g); in the weight gradient a row pitch ≡ KW and a plane ≡ KH·KW (mod 32), where they
// are consecutive taps.
struct DirectConv {
    int samples, in_channels, in_h, in_w, out_channels, out_h, out_w;
    int kernel_h, kernel_w, stride, pad_y, pad_x, flip;
    int band_rows, bands, chunk, tile_h, tile_w, pitch, plane;
    int tf32;  // the tensor-core kernels: 1 for one TF32 product (Device::set_precision's Tf32), 0 for 3xTF32
};

// The shared-memory address of p, 32 bits.
__device__ __forceinline__ unsigned shared_address(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// Where the input's rows and the tile's can both be copied 16 bytes at a time (rows_by_16), the band's rows
// go as 16-byte copies and the columns of padding as stores of 0: a quarter of the copies, and of their
// index work.
__device__ __forceinline__ bool rows_by_16(const float* tile, const float* in, const DirectConv& v) {
    return v.in_w % 4 == 0 && v.pitch % 4 == 0 && v.plane % 4 == 0 && v.pad_x >= 0 &&
           v.tile_w - v.pad_x >= v.in_w && ((size_t)in & 15) == 0 && (shared_address(tile + v.pad_x) & 15) == 0;
}

__device__ __forceinline__ void stage_band_by_16(float* __restrict__ tile, const float* __restrict__ src,
                                                 const DirectConv& v, int count, int y0) {
    const int quads = v.in_w / 4, rows = count * v.tile_h;
    const int step_rows = blockDim.x / quads, step_quads = blockDim.x - step_rows * quads;
    int row = threadIdx.x / quads, q = threadIdx.x - row * quads;
    int c = row / v.tile_h, ty = row - c * v.tile_h;
    while (c < count) {
        const int iy = y0 + ty;
        const bool inside = (unsigned)iy < (unsigned)v.in_h;
        cp_async16_or_zero(tile + c * v.plane + ty * v.pitch + v.pad_x + 4 * q,
                           inside ? src + ((size_t)c * v.in_h + iy) * v.in_w + 4 * q : src, inside);
        q += step_quads, ty += step_rows;
        if (q >= quads) q -= quads, ++ty;
        while (ty >= v.tile_h) ty -= v.tile_h, ++c;
    }
    // The columns outside the input: pad_x on the left, the rest of the tile's width on the right.
    const int pads = v.tile_w - v.in_w;
    for (int i = threadIdx.x; i < rows * pads; i += blockDim.x) {
        const int r = i / pads, k = i - r * pads, tc = r / v.tile_h;
        tile[tc * v.plane + (r - tc * v.tile_h) * v.pitch + (k < v.pad_x ? k : v.in_w + k)] = 0.0f;
    }
}

// Starts copying channels [c0, c0 + count) of sample s's band whose first output row is oy0 into tile
// (count × tile_h × tile_w at the pitches, 0 outside the input), cp.async: a thread issues all its copies
// without waiting on one (a block has few threads, so loads that each waited would leave the SM idle). Every
// thread of the block takes part (blocks of any size): elements threadIdx.x + k·blockDim.x of the band in
// row-major order, each one's (channel, row, column) stepped from the thread's last, not divided out of its
// index (with two divisions an element, the ResNet example's captured step took 628 µs, against 563 µs; a
// warp copying whole rows, a row's index work done once, took 583 µs against 553 µs). cp_async_commit,
// cp_async_wait_all and a barrier end it.
__device__ __forceinline__ void stage_band(float* __restrict__ tile, const float* __restrict__ in,
                                           const DirectConv& v, int s, int c0, int count, int oy0) {
    const int y0 = oy0 * v.stride - v.pad_y;
    const float* src = in + ((size_t)s * v.in_channels + c0) * v.in_h * v.in_w;
    if (rows_by_16(tile, src, v)) return stage_band_by_16(tile, src, v, count, y0);
    const int step_rows = blockDim.x / v.tile_w, step_columns = blockDim.x - step_rows * v.tile_w;
    int row = threadIdx.x / v.tile_w, tx = threadIdx.x - row * v.tile_w;
    int c = row / v.tile_h, ty = row - c * v.tile_h;
    while (c < count) {
        const int iy = y0 + ty, ix = tx - v.pad_x;
        const bool inside = (unsigned)iy < (unsigned)v.in_h && (unsigned)ix < (unsigned)v.in_w;
        cp_async4_or_zero(tile + c * v.plane + ty * v.pitch + tx,
                          inside ? src + ((size_t)c * v.in_h + iy) * v.in_w + ix : src, inside ? 4 : 0);
        tx += step_columns, ty += step_rows;
        if (tx >= v.tile_w) tx -= v.tile_w, ++ty;
        while (ty >= v.tile_h) ty -= v.tile_h, ++c;
    }
}

// The index in w of the weight that a window walk's result channel o takes from its operand's channel c
// at tap t (ky·KW + kx): w[o][c][t], or, flipped for the input gradient, w[c][o][KH·KW − 1 − t].
__device__ __forceinline__ size_t window_weight(const DirectConv& v, int o, size_t c, int t) {
    const int taps = v.kernel_h * v.kernel_w;
    return v.flip ? (c * v.out_channels + o) * taps + taps - 1 - t : ((size_t)o * v.in_channels + c) * taps + t;
}

// The weight gradients' plane of ones, which the bias's tap (c = C, ky = kx = 0) reads after the staged
// channels: every thread of the block takes part.
__device__ __forceinline__ void stage_ones(float* plane, const DirectConv& v) {
    for (int i = threadIdx.x; i < v.plane; i += blockDim.x) plane[i] = 1.0f;
}

// Whether a direct window walk is a 3×3 one at stride 1, the common case, which takes a thread's positions
// side by side (DIRECT_PX·g + j, not g + j·G): the 6 staged elements of a kernel row then serve the row's
// three taps, read as a float4 and a float2, against 12 elements read one by one, and the taps unroll.
// The launch layer pads the row pitch to ≡ DIRECT_PX·G (mod 32) for it (a quarter warp's float4 reads in
// distinct banks), and to ≡ G otherwise.
__device__ __forceinline__ bool direct_packed(const DirectConv& v) {
    return v.kernel_h == 3 && v.kernel_w == 3 && v.stride == 1;
}

// acc[o][j] += w[o] · xv[j] for a thread's DIRECT_OUT weights of a tap (ws, DIRECT_OUT / 4 float4s) and its
// DIRECT_PX elements.
__device__ __forceinline__ void direct_tap(float (&acc)[DIRECT_OUT][DIRECT_PX], const float4* ws, const float* xv) {
#pragma unroll
    for (int q = 0; q < DIRECT_OUT / 4; ++q) {
        const float4 w4 = ws[q];
#pragma unroll
        for (int j = 0; j < DIRECT_PX; ++j) {
            acc[4 * q][j] = fmaf(w4.x, xv[j], acc[4 * q][j]);
            acc[4 * q + 1][j] = fmaf(w4.y, xv[j], acc[4 * q + 1][j]);
            acc[4 * q + 2][j] = fmaf(w4.z, xv[j], acc[4 * q + 2][j]);
            acc[4 * q + 3][j] = fmaf(w4.w, xv[j], acc[4 * q + 3][j]);
        }
    }
}
static_assert(DIRECT_PX == 4, "the packed 3×3 walk reads a float4 and a float2 a kernel row");

// What a direct window walk does with its results beside storing them: the ReLU fusions of the capture
// (nn/cuda/fusion.rs). In the forward, activated[e] = relu(out[e]) where a ReLU reads the result (nn_unary's
// expression), or, where a residual block's sum reads it and a ReLU the sum, sum[e] = residual[e] + out[e] and
// activated[e] = relu(sum[e]) (nn_add_relu's, in place of its launch); in the input gradient, out[e] times the
// ReLU's slope where a ReLU made the convolution's input (relu_out, its output: nn_unary_grad's expression), in
// place of that op's launch; and before that slope, where the input has another gradient already (addend),
// addend[e] + out[e] (nn_binary's sum of two gradients, in place of its launch). Null pointers: none. ReLU alone,
// the convnets' activation: each activation's code in every store made the tensor-core kernel's PTX six times
// longer and every one of its launches, fused or not, slower (a 16→16 forward of the ResNet example took 41.5 µs
// against 31 µs).
struct WindowEpilogue {
    float* activated;
    const float* relu_out;
    const float* residual;
    float* sum;
    const float* addend;
};

// What the tensor-core kernel's stores do, known at compile time, so that a launch without the residual or
// the addend keeps the code it had (the residual's code in every store made each of the ResNet example's
// nine nn_conv2d_mma launches 2.8 µs slower): nothing more, the forward's residual sum, or the input
// gradient's addend.
constexpr int WINDOW_PLAIN = 0, WINDOW_RESIDUAL = 1, WINDOW_ADDEND = 2;

// The slope by which the input gradient's out[e] is multiplied, where the epilogue has a ReLU's (relu_out).
__device__ __forceinline__ float window_slope(const WindowEpilogue& f, size_t e) {
    return activation_slope(ACT_RELU, f.relu_out[e]);
}

// out[e] = value, and where the epilogue has them, the forward's ReLU of it or its residual sum and that
// sum's ReLU.
__device__ __forceinline__ void store_window(float* __restrict__ out, size_t e, float value, const WindowEpilogue& f) {
    out[e] = value;
    if (f.residual) {
        const float summed = binary_apply(OP_ADD, f.residual[e], value);
        f.sum[e] = summed;
        f.activated[e] = unary_apply(UNARY_RELU, summed);
    } else if (f.activated) {
        f.activated[e] = activate(ACT_RELU, value);
    }
}

// Grid: (N·bands, ⌈out_channels/DIRECT_BLOCK_OUT⌉), blocks of DIRECT_SPLIT·band_rows·G threads or more (a
// multiple of 32, at most THREADS); shared memory chunk · (KH·KW·DIRECT_BLOCK_OUT + plane) floats, the
// weights first. bias and the WindowEpilogue's pointers may be null.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_conv2d_direct(const DirectConv v, const float* __restrict__ in, const float* __restrict__ w,
                 const float* __restrict__ bias, float* __restrict__ out, float* __restrict__ activated,
                 const float* __restrict__ relu_out, const float* __restrict__ residual, float* __restrict__ sum,
                 const float* __restrict__ addend) {
    begin_after_previous_grid();
    const WindowEpilogue epilogue{activated, relu_out, residual, sum, addend};
    extern __shared__ float4 smem4[];
    float* weights = reinterpret_cast<float*>(smem4);  // [c][ky][kx][o], DIRECT_BLOCK_OUT a tap
    const int taps = v.kernel_h * v.kernel_w, groups = (v.out_w + DIRECT_PX - 1) / DIRECT_PX;
    float* tile = weights + v.chunk * taps * DIRECT_BLOCK_OUT;
    const int s = blockIdx.x / v.bands, oy0 = (blockIdx.x - s * v.bands) * v.band_rows;
    const int o0 = blockIdx.y * DIRECT_BLOCK_OUT, band = v.band_rows * groups;
    const int split = threadIdx.x / band, k = threadIdx.x - split * band, g = k % groups;
    const int first = o0 + split * DIRECT_OUT;  // the thread's first channel
    // A thread past the last group, or whose channels are all past the last, takes no row.
    const int rows = min(v.band_rows, v.out_h - oy0);
    const int row = split < DIRECT_SPLIT && first < v.out_channels ? k / groups : rows;
    const bool packed = direct_packed(v);
    float acc[DIRECT_OUT][DIRECT_PX] = {};
    for (int c0 = 0; c0 < v.in_channels; c0 += v.chunk) {
        const int count = min(v.chunk, v.in_channels - c0);
        __syncthreads();  // the last chunk read
        // weights[c][t][o]: a thread keeps one o (blocks are whole warps) and steps its taps (c, t). The
        // flipped tap of t is taps − 1 − t: (KH − 1 − ky)·KW + KW − 1 − kx.
        const int lane_o = threadIdx.x % DIRECT_BLOCK_OUT, o = o0 + lane_o;
        for (int ct = threadIdx.x / DIRECT_BLOCK_OUT, c = ct / taps, t = ct - c * taps; c < count;) {
            const size_t at = window_weight(v, o, c0 + c, t);
            cp_async4_or_zero(weights + (c * taps + t) * DIRECT_BLOCK_OUT + lane_o, o < v.out_channels ? w + at : w,
                              o < v.out_channels ? 4 : 0);
            for (t += blockDim.x / DIRECT_BLOCK_OUT; t >= taps; t -= taps) ++c;
        }
        stage_band(tile, in, v, s, c0, count, oy0);
        cp_async_commit();
        cp_async_wait_all();
        __syncthreads();
        if (row >= rows) continue;
        const float4* w4s = reinterpret_cast<const float4*>(weights) + split * (DIRECT_OUT / 4);
        if (packed) {
            for (int c = 0; c < count; ++c)
#pragma unroll
                for (int ky = 0; ky < 3; ++ky) {
                    const float* xs = tile + c * v.plane + (row + ky) * v.pitch + DIRECT_PX * g;
                    const float4 a = *reinterpret_cast<const float4*>(xs);
                    const float2 b = *reinterpret_cast<const float2*>(xs + 4);
                    const float xv[6] = {a.x, a.y, a.z, a.w, b.x, b.y};
#pragma unroll
                    for (int kx = 0; kx < 3; ++kx) direct_tap(acc, w4s + (c * 9 + ky * 3 + kx) * (DIRECT_BLOCK_OUT / 4), xv + kx);
                }
            continue;
        }
        for (int c = 0; c < count; ++c)
            for (int ky = 0; ky < v.kernel_h; ++ky) {
                const float* xs = tile + c * v.plane + (row * v.stride + ky) * v.pitch + g * v.stride;
                for (int kx = 0; kx < v.kernel_w; ++kx) {
                    float xv[DIRECT_PX];
#pragma unroll
                    for (int j = 0; j < DIRECT_PX; ++j) xv[j] = xs[j * groups * v.stride + kx];
                    direct_tap(acc, w4s + (c * taps + ky * v.kernel_w + kx) * (DIRECT_BLOCK_OUT / 4), xv);
                }
            }
    }
    if (row >= rows) return;
#pragma unroll
    for (int o = 0; o < DIRECT_OUT; ++o) {
        if (first + o >= v.out_channels) break;
        const size_t at = (((size_t)s * v.out_channels + first + o) * v.out_h + oy0 + row) * v.out_w;
        const float b = bias ? bias[first + o] : 0.0f;
#pragma unroll
        for (int j = 0; j < DIRECT_PX; ++j) {
            const int ox = packed ? DIRECT_PX * g + j : g + j * groups;
            if (ox < v.out_w) {
                const float value = bias ? acc[o][j] + b : acc[o][j];
                const float total = epilogue.addend ? binary_apply(OP_ADD, epilogue.addend[at + ox], value) : value;
                const float sloped = epilogue.relu_out ? total * window_slope(epilogue, at + ox) : total;
                store_window(out, at + ox, sloped, epilogue);
            }
        }
    }
}

// acc[o][i] += Σ dy[o] · x at tap i over a band's `rows` rows of positions: dys the staged dy ([position]
// [GRAD_OUT], from the thread's first channel), x the staged tile at offset[i]. STRIDE is the convolution's
// stride, or 0 to read v.stride: at 1 the positions unroll with their offsets known.
template <int STRIDE>
__device__ __forceinline__ void grad_weight_band(float (&acc)[8][4], const DirectConv& v, const float* dys,
                                                 const float* tile, const int (&offset)[4], int rows) {
    const int stride = STRIDE ? STRIDE : v.stride;
    for (int r = 0; r < rows; ++r) {
        const float* drow = dys + r * v.out_w * GRAD_OUT;
        const float* xrow = tile + r * stride * v.pitch;
#pragma unroll 4
        for (int ox = 0; ox < v.out_w; ++ox) {
            const float4 d0 = *reinterpret_cast<const float4*>(drow + ox * GRAD_OUT);
            const float4 d1 = *reinterpret_cast<const float4*>(drow + ox * GRAD_OUT + 4);
            const float d[8] = {d0.x, d0.y, d0.z, d0.w, d1.x, d1.y, d1.z, d1.w};
            float xv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) xv[i] = xrow[offset[i] + ox * stride];
#pragma unroll
            for (int o = 0; o < 8; ++o)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[o][i] = fmaf(d[o], xv[i], acc[o][i]);
        }
    }
}

// The weight gradient (the forward's DirectConv: in = x, out = dy) of sample s's band into the slice
// s·bands + band: dw_parts[slice][O][taps] and, when db_parts is not null, db_parts[slice][O]. Blocks of 2·L
// threads (L a multiple of 16, at most DIRECT_TAPS / 4) take 4·L taps each. Grid: (N·bands, ⌈O/GRAD_OUT⌉ ·
// ⌈(taps + 1)/(4·L)⌉); shared memory band_rows · OW · GRAD_OUT (dy, [position][o]) + (chunk + 1) · plane
// floats (x, channels from the block's first tap's, chunk covering its last tap's, then a plane of ones).
extern "C" __global__ void __launch_bounds__(THREADS)
nn_conv2d_direct_grad_weight(const DirectConv v, const float* __restrict__ dy, const float* __restrict__ x,
                             float* __restrict__ dw_parts, float* __restrict__ db_parts) {
    begin_after_previous_grid();
    extern __shared__ float4 smem4[];
    float* dys = reinterpret_cast<float*>(smem4);
    const int khw = v.kernel_h * v.kernel_w, taps = v.in_channels * khw, columns = taps + (db_parts ? 1 : 0);
    const int o_blocks = (v.out_channels + GRAD_OUT - 1) / GRAD_OUT;
    const int lanes = blockDim.x / 2, half = threadIdx.x / lanes, lane = threadIdx.x % lanes;
    const int o0 = blockIdx.y % o_blocks * GRAD_OUT, t0 = blockIdx.y / o_blocks * 4 * lanes;
    const int s = blockIdx.x / v.bands, oy0 = (blockIdx.x - s * v.bands) * v.band_rows;
    const int rows = min(v.band_rows, v.out_h - oy0), positions = rows * v.out_w;
    float* tile = dys + v.band_rows * v.out_w * GRAD_OUT;
    const int c0 = t0 / khw, count = min(v.chunk, v.in_channels - c0);
    for (int i = threadIdx.x; i < positions * GRAD_OUT; i += blockDim.x) {
        const int p = i / GRAD_OUT, o = o0 + i % GRAD_OUT;
        const float* at = dy + (((size_t)s * v.out_channels + o) * v.out_h + oy0) * v.out_w + p;
        cp_async4_or_zero(dys + i, o < v.out_channels ? at : dy, o < v.out_channels ? 4 : 0);
    }
    stage_band(tile, x, v, s, c0, count, oy0);
    cp_async_commit();
    if (db_parts) stage_ones(tile + count * v.plane, v);
    cp_async_wait_all();
    __syncthreads();
    // Thread: channels o0 + half·8 + [0, 8), taps t0 + lane + i·L (i < 4), so that a warp reads consecutive
    // taps, which the pitches put in consecutive banks; a tap past the bias's (tap == taps) reads anything
    // and is not written.
    if (t0 + lane >= columns) return;
    int offset[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int t = t0 + lane + i * lanes;
        const int c = t / khw, kk = t - c * khw, ky = kk / v.kernel_w, kx = kk - ky * v.kernel_w;
        offset[i] = t <= taps ? (c - c0) * v.plane + ky * v.pitch + kx : 0;
    }
    float acc[8][4] = {};
    if (v.stride == 1) grad_weight_band<1>(acc, v, dys + half * 8, tile, offset, rows);
    else grad_weight_band<0>(acc, v, dys + half * 8, tile, offset, rows);
    const size_t slice = blockIdx.x;
#pragma unroll
    for (int o = 0; o < 8; ++o) {
        const int oc = o0 + half * 8 + o;
        if (oc >= v.out_channels) break;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int t = t0 + lane + i * lanes;
            if (t >= columns) break;
            if (t < taps) dw_parts[(slice * v.out_channels + oc) * taps + t] = acc[o][i];
            else db_parts[slice * v.out_channels + oc] = acc[o][i];
        }
    }
}

// ---- conv2d direct on the tensor cores (3xTF32, or TF32) ----
// The direct kernels' windows and staged bands as m16n8k8 TF32 products, where the CUDA cores' fp32 walks
// above are bound by issuing their FMAs (a 16→16 3×3 forward issued 18.8M instructions, 2.6 a FMA; here
// 14.1M, 7.8M of them the staging's). Each operand x is split in two TF32 values, big (x truncated to TF32)
// and small (x − big, truncated), and a product is small·big' + big·small' + big·big' (3xTF32, the small
// terms first): what is dropped lies within 2^-20 of the product, so the sums keep close to fp32's
// accuracy, though not the CPU twin's order of additions (the checks' tolerance), and an inf operand gives
// a NaN (its small part is inf − inf). At Device::set_precision(Tf32) (DirectConv's tf32) a product is
// big·big' alone: the operands truncated to TF32 and their products summed in fp32, as PyTorch's
// convolutions by default, a third of the mma's. Each output is still written by one thread after a fixed
// order of `mma`s, so a run repeats to the bit.
//   forward     a GEMM of the band's positions (M, row-major) by MMA_OUT result channels (N) over the taps
//               k = (c, ky, kx) of the staged chunk (K): A[p][k] = tile[at(p) + offset(k)], B = the weights
//               staged [k][o]. A block takes one sample's band and MMA_OUT channels, a warp MMA_TILES m16
//               tiles of its positions; the input gradient, as above, flips the kernel (`flip`).
//   weight grad dw[o][t] = Σ_p dy[o][p] · X[p][t] over one sample's band: M = MMA_OUT channels, N the taps (and
//               the bias's tap of ones after the last), K the band's positions. A block takes MMA_OUT
//               channels and a range of taps, a warp MMA_GRAD_TILES n8 tiles of them; each block's sums go to
//               its own slice, as nn_conv2d_direct_grad_weight's.
constexpr int MMA_OUT = 16, MMA_TILES = 4, MMA_GRAD_TILES = 3;
// Floats between two taps' weights in shared memory: ≡ 24 (mod 32) puts a warp's B fragments (8 channels ×
// 4 taps) in distinct banks.
constexpr int MMA_WEIGHT_PITCH = 24;

// x's two TF32 parts by truncation (a mask, where cvt.rna.tf32 costs several instructions): both exact
// TF32 values, x − big exact in fp32.
__device__ __forceinline__ void split_tf32(float x, unsigned& big, unsigned& small) {
    constexpr unsigned TF32_BITS = 0xffffe000u;  // sign, exponent and the top 10 mantissa bits
    big = __float_as_uint(x) & TF32_BITS;
    small = __float_as_uint(x - __uint_as_float(big)) & TF32_BITS;
}

// An operand fragment of N values, split.
template <int N>
__device__ __forceinline__ void split_fragment(const float (&x)[N], unsigned (&big)[N], unsigned (&small)[N]) {
#pragma unroll
    for (int r = 0; r < N; ++r) split_tf32(x[r], big[r], small[r]);
}

// A float loaded from a shared address: the windows' reads address the tile in 32 bits (with C++ indexing
// each read took a 64-bit sign extension, add and shift, 5 instructions a read).
__device__ __forceinline__ float load_shared(unsigned address) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(address));
    return v;
}

// d += a·b from the operands' split fragments: in 3xTF32, or, ONE_PASS, the one product of their big
// parts (the operands truncated to TF32, as PyTorch's TF32 convolutions; the small parts then go unused
// and are not computed).
template <bool ONE_PASS>
__device__ __forceinline__ void mma_split(float (&d)[4], const unsigned (&a_big)[4], const unsigned (&a_small)[4],
                                          const unsigned (&b_big)[2], const unsigned (&b_small)[2]) {
    if (!ONE_PASS) {
        mma_tf32(d, a_small, b_big);
        mma_tf32(d, a_big, b_small);
    }
    mma_tf32(d, a_big, b_big);
}

// The offset in the staged tile of a position p of the band (its row and column), for a walk of `stride`.
__device__ __forceinline__ int band_offset(const DirectConv& v, int p) {
    const int r = p / v.out_w;
    return (r * v.pitch + p - r * v.out_w) * v.stride;
}

// weights[k][o] for the chunk of `count` channels from c0 and the MMA_OUT result channels from o0 (k = c·taps + t,
// rows MMA_WEIGHT_PITCH apart; 0 past the chunk's taps up to k_pad and past the result channels): a thread takes
// a (result channel, chunk channel) pair at a time and copies its taps, which lie side by side in w (reversed
// where the kernel is flipped), so no index is divided per weight. (A thread stepping k with one o, its index
// worked out per weight, issued a quarter of a 16→16 forward's instructions.)
__device__ __forceinline__ void stage_mma_weights(float* weights, const float* __restrict__ w, const DirectConv& v,
                                                  int o0, int c0, int count, int k_pad) {
    const int taps = v.kernel_h * v.kernel_w, step = v.flip ? -1 : 1;
    for (int q = threadIdx.x; q < MMA_OUT * count; q += blockDim.x) {
        const int lane_o = q % MMA_OUT, c = q / MMA_OUT, o = o0 + lane_o;
        float* to = weights + c * taps * MMA_WEIGHT_PITCH + lane_o;
        if (o < v.out_channels) {
            const float* from = w + window_weight(v, o, c0 + c, 0);
            for (int t = 0; t < taps; ++t) cp_async4(to + t * MMA_WEIGHT_PITCH, from + step * t);
        } else {
            for (int t = 0; t < taps; ++t) to[t * MMA_WEIGHT_PITCH] = 0.0f;
        }
    }
    const int tail = k_pad - count * taps;
    for (int i = threadIdx.x; i < tail * MMA_OUT; i += blockDim.x)
        weights[(count * taps + i / MMA_OUT) * MMA_WEIGHT_PITCH + i % MMA_OUT] = 0.0f;
}

// The row pitch of conv2d_mma's results in shared memory ([channel][position]): the block's positions,
// ≡ 4 (mod 32), so that a warp's fragment stores (8 positions × 4 channels two rows apart) take distinct banks
// (direct_conv.rs's mma_result_floats).
__device__ __forceinline__ int mma_result_pitch() {
    const int most = blockDim.x / 32 * MMA_TILES * 16;
    return most + (36 - most % 32) % 32;
}

// Whether out and every array of a window's epilogue are 16-byte aligned (the null ones are).
__device__ __forceinline__ bool window_operands_by_16(const float* out, const WindowEpilogue& f) {
    const size_t any = (size_t)out | (size_t)f.activated | (size_t)f.relu_out | (size_t)f.residual | (size_t)f.sum |
                       (size_t)f.addend;
    return (any & 15) == 0;
}

// N (1 or 4) consecutive floats of a global array, loaded together.
template <int N>
__device__ __forceinline__ void load_run(const float* __restrict__ from, float (&to)[N]) {
    if constexpr (N == 4) {
        const float4 x = *reinterpret_cast<const float4*>(from);
        to[0] = x.x, to[1] = x.y, to[2] = x.z, to[3] = x.w;
    } else {
        to[0] = *from;
    }
}

template <int N>
__device__ __forceinline__ void store_run(float* __restrict__ to, const float (&from)[N]) {
    if constexpr (N == 4) *reinterpret_cast<float4*>(to) = make_float4(from[0], from[1], from[2], from[3]);
    else *to = from[0];
}

// The operands that the tensor-core kernel's epilogue reads for N consecutive results from out[e] on, loaded
// before any is used (WindowEpilogue's addend, relu_out and residual, as EPILOGUE and its pointers say).
template <int EPILOGUE, int N>
struct WindowOperands {
    float addend[N], relu_out[N], residual[N];

    __device__ __forceinline__ void load(const WindowEpilogue& f, size_t e) {
        if constexpr (EPILOGUE == WINDOW_ADDEND) load_run(f.addend + e, addend);
        if (f.relu_out) load_run(f.relu_out + e, relu_out);
        if constexpr (EPILOGUE == WINDOW_RESIDUAL) load_run(f.residual + e, residual);
    }
};

// The tensor-core kernel's epilogue of N consecutive results of channel oc from out[e] on (value, their
// sums over the taps), its operands loaded: in the order of nn_conv2d_direct's, the addend's sum, the
// ReLU's slope, the bias, then the store and the forward's ReLU or residual sum and its ReLU.
template <int EPILOGUE, int N>
__device__ __forceinline__ void finish_window(float* __restrict__ out, size_t e, float (&value)[N],
                                              const float* __restrict__ bias, int oc, const WindowEpilogue& f,
                                              const WindowOperands<EPILOGUE, N>& operands) {
    if constexpr (EPILOGUE == WINDOW_ADDEND) {
#pragma unroll
        for (int j = 0; j < N; ++j) value[j] = binary_apply(OP_ADD, operands.addend[j], value[j]);
    }
    if (f.relu_out) {
#pragma unroll
        for (int j = 0; j < N; ++j) value[j] *= activation_slope(ACT_RELU, operands.relu_out[j]);
    }
    if (bias) {
        const float b = bias[oc];
#pragma unroll
        for (int j = 0; j < N; ++j) value[j] = value[j] + b;
    }
    store_run(out + e, value);
    float activated[N];
    if constexpr (EPILOGUE == WINDOW_RESIDUAL) {
        float summed[N];
#pragma unroll
        for (int j = 0; j < N; ++j) {
            summed[j] = binary_apply(OP_ADD, operands.residual[j], value[j]);
            activated[j] = unary_apply(UNARY_RELU, summed[j]);
        }
        store_run(f.sum + e, summed);
        store_run(f.activated + e, activated);
    } else if (f.activated) {
#pragma unroll
        for (int j = 0; j < N; ++j) activated[j] = activate(ACT_RELU, value[j]);
        store_run(f.activated + e, activated);
    }
}

// Channels whose epilogue operands a thread of the tensor-core kernel loads together.
constexpr int WINDOW_BATCH = 4;

// Grid: (N·bands, ⌈out_channels/MMA_OUT⌉), blocks of ⌈band_rows·OW/(16·MMA_TILES)⌉ warps; shared memory
// k_pad·(MMA_WEIGHT_PITCH + 1) + chunk·plane + 4 floats (k_pad = chunk·KH·KW rounded up to 8): the weights
// [k][o] (0 past the chunk's taps), the taps' offsets in the tile in bytes (0 past them: the window's first
// element, whose product with a 0 weight is 0 where the result is finite), then the tile, up to 3 floats on
// so that its column pad_x, the input's first, is 16-byte aligned for stage_band's 16-byte copies; or, where
// it is more, MMA_OUT·mma_result_pitch() floats, which the results take on their way out. bias, activated,
// relu_out, residual, sum and addend (the WindowEpilogue) may be null.
template <bool ONE_PASS, int EPILOGUE>
__device__ __forceinline__ void conv2d_mma(const DirectConv& v, const float* __restrict__ in,
                                           const float* __restrict__ w, const float* __restrict__ bias,
                                           float* __restrict__ out, const WindowEpilogue& epilogue) {
    extern __shared__ float4 smem4[];
    const int taps = v.kernel_h * v.kernel_w, k_pad = (v.chunk * taps + 7) / 8 * 8;
    float* weights = reinterpret_cast<float*>(smem4);
    unsigned* offsets = reinterpret_cast<unsigned*>(weights + k_pad * MMA_WEIGHT_PITCH);
    float* tile = reinterpret_cast<float*>(offsets + k_pad) + (v.pad_x & 3 ? 4 - (v.pad_x & 3) : 0);
    const int s = blockIdx.x / v.bands, oy0 = (blockIdx.x - s * v.bands) * v.band_rows, o0 = blockIdx.y * MMA_OUT;
    const int positions = min(v.band_rows, v.out_h - oy0) * v.out_w;
    const int warp = threadIdx.x / 32, gid = threadIdx.x % 32 / 4, tig = threadIdx.x % 4;
    unsigned at[MMA_TILES][2];  // the shared addresses of the thread's rows gid and gid + 8 of its m-tiles
#pragma unroll
    for (int i = 0; i < MMA_TILES; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int p = (warp * MMA_TILES + i) * 16 + gid + 8 * h;
            at[i][h] = shared_address(tile + (p < positions ? band_offset(v, p) : 0));
        }
    float acc[MMA_TILES][2][4] = {};
    for (int c0 = 0; c0 < v.in_channels; c0 += v.chunk) {
        const int count = min(v.chunk, v.in_channels - c0), k_count = count * taps;
        __syncthreads();  // the last chunk read
        stage_mma_weights(weights, w, v, o0, c0, count, k_pad);
        for (int k = threadIdx.x; k < k_pad; k += blockDim.x) {
            const int c = k / taps, t = k - c * taps, ky = t / v.kernel_w;
            offsets[k] = k < k_count ? 4 * (c * v.plane + ky * v.pitch + t - ky * v.kernel_w) : 0;
        }
        // Two groups of copies, the weights with the first half of the channels, then the rest: the first
        // half's taps are multiplied while the rest arrive (the ResNet example's captured step took 508.4 µs,
        // against 512.0 µs staging the chunk at once).
        const int half = count / 2, k_split = half * taps / 8 * 8;
        stage_band(tile, in, v, s, c0, half, oy0);
        cp_async_commit();
        stage_band(tile + half * v.plane, in, v, s, c0 + half, count - half, oy0);
        cp_async_commit();
        const auto multiply = [&](int k_begin, int k_end) {
            for (int k = k_begin; k < k_end; k += 8) {
                const unsigned ka = offsets[k + tig], kb = offsets[k + tig + 4];
                unsigned b_big[2][2], b_small[2][2];
#pragma unroll
                for (int nb = 0; nb < 2; ++nb) {
                    const float b[2] = {weights[(k + tig) * MMA_WEIGHT_PITCH + nb * 8 + gid],
                                        weights[(k + tig + 4) * MMA_WEIGHT_PITCH + nb * 8 + gid]};
                    split_fragment(b, b_big[nb], b_small[nb]);
                }
#pragma unroll
                for (int i = 0; i < MMA_TILES; ++i) {
                    const float a[4] = {load_shared(at[i][0] + ka), load_shared(at[i][1] + ka),
                                        load_shared(at[i][0] + kb), load_shared(at[i][1] + kb)};
                    unsigned a_big[4], a_small[4];
                    split_fragment(a, a_big, a_small);
#pragma unroll
                    for (int nb = 0; nb < 2; ++nb) mma_split<ONE_PASS>(acc[i][nb], a_big, a_small, b_big[nb], b_small[nb]);
                }
            }
        };
        cp_async_wait_all_but_one();
        __syncthreads();
        multiply(0, k_split);
        cp_async_wait_all();
        __syncthreads();
        multiply(k_split, k_pad);
    }
    // The results leave through shared memory: each channel's band positions lie side by side in out, so
    // that the block writes them, and reads the epilogue's operands, as whole runs, 16 bytes at a time where
    // they align (each thread storing its fragments' elements one by one, each after its operands' loads,
    // took half of a 16→16 forward's instructions and most of its stalls).
    __syncthreads();  // the tile and the weights read
    float* results = reinterpret_cast<float*>(smem4);
    const int result_pitch = mma_result_pitch();
#pragma unroll
    for (int i = 0; i < MMA_TILES; ++i)
#pragma unroll
        for (int nb = 0; nb < 2; ++nb)
#pragma unroll
            for (int r = 0; r < 4; ++r)
                results[(nb * 8 + 2 * tig + r % 2) * result_pitch + (warp * MMA_TILES + i) * 16 + gid + r / 2 * 8] =
                    acc[i][nb][r];
    __syncthreads();
    const size_t plane = (size_t)v.out_h * v.out_w;
    const size_t first = ((size_t)s * v.out_channels + o0) * plane + (size_t)oy0 * v.out_w;
    const int channels = min(MMA_OUT, v.out_channels - o0);
    if (positions % 4 == 0 && plane % 4 == 0 && first % 4 == 0 && window_operands_by_16(out, epilogue)) {
        // Thread: the quad p of its group's channels, g, g + groups, … (positions ≤ 2·blockDim.x, so that
        // groups ≥ 2), WINDOW_BATCH at a time, their operands loaded first.
        const int quads = positions / 4, groups = blockDim.x / quads, g = threadIdx.x / quads;
        const int p = 4 * (threadIdx.x - g * quads);
        if (g >= groups) return;
        for (int oc0 = g; oc0 < channels; oc0 += groups * WINDOW_BATCH) {
            WindowOperands<EPILOGUE, 4> operands[WINDOW_BATCH];
#pragma unroll
            for (int b = 0; b < WINDOW_BATCH; ++b) {
                const int oc = oc0 + b * groups;
                if (oc < channels) operands[b].load(epilogue, first + oc * plane + p);
            }
#pragma unroll
            for (int b = 0; b < WINDOW_BATCH; ++b) {
                const int oc = oc0 + b * groups;
                if (oc >= channels) break;
                const float4 r4 = *reinterpret_cast<const float4*>(results + oc * result_pitch + p);
                float value[4] = {r4.x, r4.y, r4.z, r4.w};
                finish_window(out, first + oc * plane + p, value, bias, o0 + oc, epilogue, operands[b]);
            }
        }
    } else {
        for (int q = threadIdx.x; q < channels * positions; q += blockDim.x) {
            const int oc = q / positions, p = q - oc * positions;
            float value[1] = {results[oc * result_pitch + p]};
            WindowOperands<EPILOGUE, 1> operands;
            operands.load(epilogue, first + oc * plane + p);
            finish_window(out, first + oc * plane + p, value, bias, o0 + oc, epilogue, operands);
        }
    }
}

// conv2d_mma with the epilogue's kind, as its pointers say.
template <bool ONE_PASS>
__device__ __forceinline__ void conv2d_mma_with(const DirectConv& v, const float* __restrict__ in,
                                                const float* __restrict__ w, const float* __restrict__ bias,
                                                float* __restrict__ out, const WindowEpilogue& epilogue) {
    if (epilogue.residual) conv2d_mma<ONE_PASS, WINDOW_RESIDUAL>(v, in, w, bias, out, epilogue);
    else if (epilogue.addend) conv2d_mma<ONE_PASS, WINDOW_ADDEND>(v, in, w, bias, out, epilogue);
    else conv2d_mma<ONE_PASS, WINDOW_PLAIN>(v, in, w, bias, out, epilogue);
}

extern "C" __global__ void __launch_bounds__(THREADS)
nn_conv2d_mma(const DirectConv v, const float* __restrict__ in, const float* __restrict__ w,
              const float* __restrict__ bias, float* __restrict__ out, float* __restrict__ activated,
              const float* __restrict__ relu_out, const float* __restrict__ residual, float* __restrict__ sum,
              const float* __restrict__ addend) {
    begin_after_previous_grid();
    const WindowEpilogue epilogue{activated, relu_out, residual, sum, addend};
    if (v.tf32) conv2d_mma_with<true>(v, in, w, bias, out, epilogue);
    else conv2d_mma_with<false>(v, in, w, bias, out, epilogue);
}

// The weight gradient (the forward's DirectConv: in = x, out = dy) of sample s's band into the slice
// s·bands + band, as nn_conv2d_direct_grad_weight's. Blocks of `warps` warps take 8·MMA_GRAD_TILES·warps
// taps each from t0 (the bias's after the last). Grid: (N·bands, ⌈O/MMA_OUT⌉ ·
// ⌈(taps + 1)/(8·MMA_GRAD_TILES·warps)⌉); shared memory MMA_OUT·dy_pitch floats (dy, [o][position], 0 past
// the band's positions up to a multiple of 8; dy_pitch ≡ 4 (mod 32), direct_conv.rs's mma_dy_pitch, puts a
// warp's A fragments in distinct banks) + (chunk + 1)·plane floats (x, channels from the block's first
// tap's, then a plane of ones) + the band's positions up to a multiple of 8 (their offsets in the tile).
template <bool ONE_PASS>
__device__ __forceinline__ void conv2d_mma_grad_weight(const DirectConv& v, const float* __restrict__ dy,
                                                       const float* __restrict__ x, float* __restrict__ dw_parts,
                                                       float* __restrict__ db_parts) {
    extern __shared__ float4 smem4[];
    float* dys = reinterpret_cast<float*>(smem4);
    const int khw = v.kernel_h * v.kernel_w, taps = v.in_channels * khw, columns = taps + (db_parts ? 1 : 0);
    const int o_blocks = (v.out_channels + MMA_OUT - 1) / MMA_OUT, per_block = blockDim.x / 32 * 8 * MMA_GRAD_TILES;
    const int o0 = blockIdx.y % o_blocks * MMA_OUT, t0 = blockIdx.y / o_blocks * per_block;
    const int s = blockIdx.x / v.bands, oy0 = (blockIdx.x - s * v.bands) * v.band_rows;
    const int positions = min(v.band_rows, v.out_h - oy0) * v.out_w, k_pad = (positions + 7) / 8 * 8;
    const int most = (v.band_rows * v.out_w + 7) / 8 * 8, dy_pitch = most + (36 - most % 32) % 32;
    float* tile = dys + MMA_OUT * dy_pitch;
    const int c0 = t0 / khw, count = min(v.chunk, v.in_channels - c0);
    // dy's rows: a channel's band positions lie side by side in dy, so where they align they go 16 bytes
    // at a time, a quarter of the copies and of their index work.
    const size_t plane_out = (size_t)v.out_h * v.out_w;
    const float* dy_band = dy + (size_t)s * v.out_channels * plane_out + (size_t)oy0 * v.out_w;
    if (positions % 4 == 0 && plane_out % 4 == 0 && oy0 * v.out_w % 4 == 0 && ((size_t)dy & 15) == 0) {
        const int quads = k_pad / 4;
        for (int i = threadIdx.x; i < MMA_OUT * quads; i += blockDim.x) {
            const int oo = i / quads, p = 4 * (i - oo * quads), o = o0 + oo;
            const bool real = o < v.out_channels && p < positions;
            cp_async16_or_zero(dys + oo * dy_pitch + p, real ? dy_band + o * plane_out + p : dy, real);
        }
    } else {
        for (int i = threadIdx.x; i < MMA_OUT * k_pad; i += blockDim.x) {
            const int oo = i / k_pad, p = i - oo * k_pad, o = o0 + oo;
            const bool real = o < v.out_channels && p < positions;
            cp_async4_or_zero(dys + oo * dy_pitch + p, real ? dy_band + o * plane_out + p : dy, real ? 4 : 0);
        }
    }
    stage_band(tile, x, v, s, c0, count, oy0);
    cp_async_commit();
    if (db_parts) stage_ones(tile + count * v.plane, v);
    // Each position's offset in the tile in bytes, after the planes (a position past the band's, its dy 0,
    // the band's first position's): read a k-step at a time, where stepping a position's row and column
    // took a third of the loop's instructions.
    unsigned* at = reinterpret_cast<unsigned*>(tile + (v.chunk + 1) * v.plane);
    for (int p = threadIdx.x; p < k_pad; p += blockDim.x) {
        const int r = p / v.out_w;
        at[p] = p < positions ? 4 * (r * v.pitch + p - r * v.out_w) * v.stride : 0;
    }
    cp_async_wait_all();
    __syncthreads();
    const int warp = threadIdx.x / 32, gid = threadIdx.x % 32 / 4, tig = threadIdx.x % 4;
    unsigned offset[MMA_GRAD_TILES];  // the shared address of the thread's tap (column gid) in its n-tiles
#pragma unroll
    for (int j = 0; j < MMA_GRAD_TILES; ++j) {
        const int t = t0 + (warp * MMA_GRAD_TILES + j) * 8 + gid;
        const int c = t / khw, kk = t - c * khw, ky = kk / v.kernel_w;
        // A tap past the last column reads the tile's first element, and is not written.
        offset[j] = shared_address(tile + (t < columns ? (c - c0) * v.plane + ky * v.pitch + kk - ky * v.kernel_w : 0));
    }
    // The thread's dy: channels gid and gid + 8, positions k + tig and k + tig + 4.
    const unsigned dy_at = shared_address(dys + gid * dy_pitch + tig), dy_below = 4 * 8 * dy_pitch;
    // The thread's positions k + tig and k + tig + 4: their offsets in the tile, from the block's table.
    const unsigned at_k = shared_address(at + tig);
    float acc[MMA_GRAD_TILES][4] = {};
    for (int k = 0; k < k_pad; k += 8) {
        const unsigned dy_k = dy_at + 4 * k;
        const float a[4] = {load_shared(dy_k), load_shared(dy_k + dy_below), load_shared(dy_k + 16),
                            load_shared(dy_k + dy_below + 16)};
        unsigned a_big[4], a_small[4];
        split_fragment(a, a_big, a_small);
        const unsigned at_lo = __float_as_uint(load_shared(at_k + 4 * k));
        const unsigned at_hi = __float_as_uint(load_shared(at_k + 4 * k + 16));
#pragma unroll
        for (int j = 0; j < MMA_GRAD_TILES; ++j) {
            const float b[2] = {load_shared(at_lo + offset[j]), load_shared(at_hi + offset[j])};
            unsigned b_big[2], b_small[2];
            split_fragment(b, b_big, b_small);
            mma_split<ONE_PASS>(acc[j], a_big, a_small, b_big, b_small);
        }
    }
    const size_t slice = blockIdx.x;
#pragma unroll
    for (int j = 0; j < MMA_GRAD_TILES; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int oc = o0 + gid + r / 2 * 8, t = t0 + (warp * MMA_GRAD_TILES + j) * 8 + 2 * tig + r % 2;
            if (oc >= v.out_channels || t >= columns) continue;
            if (t < taps) dw_parts[(slice * v.out_channels + oc) * taps + t] = acc[j][r];
            else db_parts[slice * v.out_channels + oc] = acc[j][r];
        }
}

extern "C" __global__ void __launch_bounds__(THREADS)
nn_conv2d_mma_grad_weight(const DirectConv v, const float* __restrict__ dy, const float* __restrict__ x,
                          float* __restrict__ dw_parts, float* __restrict__ db_parts) {
    begin_after_previous_grid();
    if (v.tf32) conv2d_mma_grad_weight<true>(v, dy, x, dw_parts, db_parts);
    else conv2d_mma_grad_weight<false>(v, dy, x, dw_parts, db_parts);
}

// max_pool2d (CPU twin: ops::conv::MaxPool2dShape::forward) over count = N·C·OH·OW outputs, a thread each,
// windows kernel×kernel: the first largest of the window's elements inside the input in row-major window
// order (padding is −∞ and never read; a NaN never wins, so a window of NaNs gives −∞ and keeps its first
// element). won[o] keeps the winner's place in its window, ky·kernel + kx, as a float (exact: the host
// checks kernel² ≤ 2^24).
extern "C" __global__ void __launch_bounds__(THREADS)
nn_max_pool(const float* __restrict__ x, float* __restrict__ y, float* __restrict__ won, int count, int H, int W,
            int kernel, int stride, int padding, int OH, int OW) {
    begin_after_previous_grid();
    for (int e = grid_index(); e < count; e += grid_stride()) {
        const int ox = e % OW, oy = e / OW % OH, plane = e / OW / OH;
        const float* in = x + (size_t)plane * H * W;
        const int y0 = oy * stride - padding, x0 = ox * stride - padding;  // the window's corner, maybe outside
        const int ky0 = max(0, -y0), ky1 = min(kernel, H - y0), kx0 = max(0, -x0), kx1 = min(kernel, W - x0);
        float best = NEG_INF;
        int at = ky0 * kernel + kx0;
        for (int ky = ky0; ky < ky1; ++ky)
            for (int kx = kx0; kx < kx1; ++kx) {
                const float v = in[(y0 + ky) * W + x0 + kx];
                if (v > best) best = v, at = ky * kernel + kx;
            }
        y[e] = best;
        won[e] = (float)at;
    }
}

// max_pool2d's backward, a thread per input element (count = N·C·H·W): dx = Σ dy over the outputs whose
// window's winner it is, the outputs in row-major order from 0 up, as the host adds them. With relu_out (not
// null: the backward's fusion, src/nn/cuda/backward_fusion.rs), x is a ReLU's output whose one reader is the
// pool, and dx is the ReLU's input's gradient: the sum times the ReLU's slope, nn_unary_grad's expression, so
// that the ReLU's backward is no launch of its own.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_max_pool_grad(const float* __restrict__ dy, const float* __restrict__ won, const float* __restrict__ relu_out,
                 float* __restrict__ dx, int count, int H, int W, int kernel, int stride, int padding, int OH, int OW) {
    begin_after_previous_grid();
    for (int e = grid_index(); e < count; e += grid_stride()) {
        const int ix = e % W, iy = e / W % H, plane = e / W / H;
        int oy0, oy1, ox0, ox1;
        windows_holding(iy, kernel, stride, padding, OH, oy0, oy1);
        windows_holding(ix, kernel, stride, padding, OW, ox0, ox1);
        float sum = 0.0f;
        for (int oy = oy0; oy <= oy1; ++oy)
            for (int ox = ox0; ox <= ox1; ++ox) {
                const size_t o = ((size_t)plane * OH + oy) * OW + ox;
                const int at = (iy + padding - oy * stride) * kernel + ix + padding - ox * stride;
                if (won[o] == (float)at) sum += dy[o];
            }
        dx[e] = relu_out ? sum * activation_slope(ACT_RELU, relu_out[e]) : sum;
    }
}

// max_pool2d's backward where the windows tile the input (stride = kernel, no padding, H = OH·kernel, W =
// OW·kernel), a thread per window (count = N·C·OH·OW): each input element lies in one window, so its dx is
// 0 + dy at the window's winner and 0 elsewhere, nn_max_pool_grad's sum of one term, to the bit. A thread a
// window writes its kernel² elements without a division each (the general kernel took 19.8 µs of the
// ResNet example's step). relu_out as nn_max_pool_grad's: the winner's dx times the ReLU's slope there (the
// others' is 0 times a slope of 0 or 1, 0).
extern "C" __global__ void __launch_bounds__(THREADS)
nn_max_pool_grad_tiled(const float* __restrict__ dy, const float* __restrict__ won, const float* __restrict__ relu_out,
                       float* __restrict__ dx, int count, int H, int W, int kernel, int stride, int padding, int OH,
                       int OW) {
    begin_after_previous_grid();
    for (int o = grid_index(); o < count; o += grid_stride()) {
        const int ox = o % OW, oy = o / OW % OH, plane = o / OW / OH, winner = (int)won[o];
        const size_t corner = ((size_t)plane * H + oy * kernel) * W + ox * kernel;
        const size_t at = corner + winner / kernel * W + winner % kernel;
        const float d = relu_out ? (0.0f + dy[o]) * activation_slope(ACT_RELU, relu_out[at]) : 0.0f + dy[o];
        float* window = dx + corner;
        for (int ky = 0; ky < kernel; ++ky)
            for (int kx = 0; kx < kernel; ++kx) window[ky * W + kx] = ky * kernel + kx == winner ? d : 0.0f;
    }
}
