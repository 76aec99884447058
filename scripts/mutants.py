#!/usr/bin/env python3
"""Proves that `textnet selftest` catches real kernel bugs: applies each deliberate mutation below to a copy
of fused/, runs the selftest on it (TEXTNET_FUSED_DIR: the binary compiles the copy, no rebuild), and
expects a failure. The unmutated copy goes first, through the same path, and must pass. Exits non-zero when
the control fails or a mutant survives. Needs a CUDA GPU.

usage: scripts/mutants.py [--bin target/release/textnet] [--jobs 4] [--seed S] [--out FILE] [NAME...]
"""
import argparse, json, os, random, shutil, subprocess, sys, tempfile
from concurrent.futures import ThreadPoolExecutor

# (name, file, exact text, replacement, the selftest part that runs it). Each text must occur exactly once.
MUTATIONS = [
    ("nn: the fused add → relu stores the ReLU of its first operand", "nn.cu",
     "activated[e] = unary_apply(UNARY_RELU, sum);", "activated[e] = unary_apply(UNARY_RELU, a[e]);", "nn"),
    ("nn: the tensor-core input gradient leaves out the addend", "nn.cu",
     "for (int j = 0; j < N; ++j) value[j] = binary_apply(OP_ADD, operands.addend[j], value[j]);", "", "nn"),
    ("nn: the CUDA-core input gradient leaves out the addend", "nn.cu",
     "const float total = epilogue.addend ? binary_apply(OP_ADD, epilogue.addend[at + ox], value) : value;",
     "const float total = value;", "nn"),
    ("nn: a CUDA-core convolution's fused residual sum stores its own result", "nn.cu",
     "f.sum[e] = summed;", "f.sum[e] = value;", "nn"),
    ("nn: a CUDA-core convolution's fused residual ReLU takes its own result, not the sum", "nn.cu",
     "f.activated[e] = unary_apply(UNARY_RELU, summed);", "f.activated[e] = unary_apply(UNARY_RELU, value);", "nn"),
    ("nn: a tensor-core convolution's fused residual sum stores its own result", "nn.cu",
     "store_run(f.sum + e, summed);", "store_run(f.sum + e, value);", "nn"),
    ("nn: a tensor-core convolution's fused residual ReLU takes its own result, not the sum", "nn.cu",
     "activated[j] = unary_apply(UNARY_RELU, summed[j]);", "activated[j] = unary_apply(UNARY_RELU, value[j]);", "nn"),
    ("nn: the tensor-core convolution's results, one at a time, read from the wrong position", "nn.cu",
     "float value[1] = {results[oc * result_pitch + p]};", "float value[1] = {results[oc * result_pitch + p / 2]};",
     "nn"),
    ("nn: the tensor-core convolution's epilogue loads a batch's operands for its first channel only", "nn.cu",
     "if (oc < channels) operands[b].load(epilogue, first + oc * plane + p);",
     "if (oc < channels) operands[b].load(epilogue, first + oc0 * plane + p);", "nn"),
    ("nn: the tensor-core convolution's results, four at a time, read from the channel before", "nn.cu",
     "const float4 r4 = *reinterpret_cast<const float4*>(results + oc * result_pitch + p);",
     "const float4 r4 = *reinterpret_cast<const float4*>(results + (oc > 0 ? oc - 1 : 0) * result_pitch + p);", "nn"),
    ("nn: the tensor-core conv stages a flipped kernel's taps in their stored order", "nn.cu",
     "const int taps = v.kernel_h * v.kernel_w, step = v.flip ? -1 : 1;",
     "const int taps = v.kernel_h * v.kernel_w, step = 1;", "nn"),
    ("nn: the tensor-core conv stages a chunk's later channels from its first", "nn.cu",
     "const float* from = w + window_weight(v, o, c0 + c, 0);", "const float* from = w + window_weight(v, o, c0, 0);",
     "nn"),
    ("nn: the tensor-core weight gradient's 16-byte dy rows start a quad late", "nn.cu",
     "cp_async16_or_zero(dys + oo * dy_pitch + p, real ? dy_band + o * plane_out + p : dy, real);",
     "cp_async16_or_zero(dys + oo * dy_pitch + p, real && p + 4 < positions ? dy_band + o * plane_out + p + 4 : dy,\n"
     "                               real && p + 4 < positions);", "nn"),
    ("nn: a broadcast operand's gradient misses the last position it was read at", "nn.cu",
     "for (int i3 = e3 > 1 ? c3 : 0; i3 < (e3 > 1 ? c3 + 1 : d3); ++i3) {",
     "for (int i3 = e3 > 1 ? c3 : 0; i3 < (e3 > 1 ? c3 + 1 : d3 - 1); ++i3) {", "nn"),
    ("nn: linear's epilogue adds the bias of the next output", "nn.cu",
     "const float pre = bias ? acc + bias[o] : acc;\n            if (z) z[e] = pre;",
     "const float pre = bias ? acc + bias[o + 1 < N ? o + 1 : o] : acc;\n            if (z) z[e] = pre;", "nn"),
    ("nn: cross-entropy's ignored rows leak a gradient", "nn.cu",
     "for (int j = lane; j < C; j += 32) g[j] = 0.0f;", "for (int j = lane; j < C; j += 32) g[j] = 1e-3f;", "nn"),
    ("nn: the fused cross-entropy counts the ignored rows too", "nn.cu",
     "counted += targets[r] != ignore ? 1.0f : 0.0f;", "counted += 1.0f;", "nn"),
    ("nn: the implicit conv's unlisted windows read their columns the padding's other way", "nn.cu",
     "const int iy = oy * v.stride + ky - v.padding, ix = ox * v.stride + kx - v.padding;",
     "const int iy = oy * v.stride + ky - v.padding, ix = ox * v.stride + kx + v.padding;", "nn"),
    ("nn: the conv's input gradient takes a tap at a position between two strides", "nn.cu",
     "if (oy * v.stride != row || ox * v.stride != column || oy >= v.out_h || ox >= v.out_w) return 0.0f;",
     "if (oy * v.stride != row || oy >= v.out_h || ox >= v.out_w) return 0.0f;", "nn"),
    ("nn: the conv's weight gradient leaves out each slice's last position", "nn.cu",
     "const int depth = min(per_slice, v.samples * positions - first);",
     "const int depth = min(per_slice, v.samples * positions - first) - 1;", "nn"),
    ("nn: the conv's bias gradient sums a column of halves", "nn.cu",
     "if (t == taps) return 1.0f;", "if (t == taps) return 0.5f;", "nn"),
    ("nn: the listed windows take one column past the input's right edge", "nn.cu",
     "(unsigned)(column.x0 + tap.kx) < (unsigned)v.width;", "(unsigned)(column.x0 + tap.kx) <= (unsigned)v.width;",
     "nn"),
    ("nn: a loss whose every row is ignored scales its saved gradient by 1/0", "nn.cu",
     "divisor ? (divisor[0] > 0.0f ? 1.0f / divisor[0] : 0.0f) : 1.0f;", "divisor ? 1.0f / divisor[0] : 1.0f;", "nn"),
    ("nn: the listed input-gradient taps step the kernel's columns the wrong way", "nn.cu",
     "outer * v.by_positions.d - ky * v.out_w - kx, ky, kx,", "outer * v.by_positions.d - ky * v.out_w + kx, ky, kx,",
     "nn"),
    ("nn: the direct input gradient swaps the kernel's channel axes without flipping it", "nn.cu",
     "(c * v.out_channels + o) * taps + taps - 1 - t", "(c * v.out_channels + o) * taps + t", "nn"),
    ("nn: the packed 3×3 direct walk swaps the last two elements of a kernel row", "nn.cu",
     "const float xv[6] = {a.x, a.y, a.z, a.w, b.x, b.y};", "const float xv[6] = {a.x, a.y, a.z, a.w, b.y, b.x};",
     "nn"),
    ("nn: the packed 3×3 direct walk stores its positions in pairs swapped", "nn.cu",
     "const int ox = packed ? DIRECT_PX * g + j : g + j * groups;",
     "const int ox = packed ? DIRECT_PX * g + (j ^ 1) : g + j * groups;", "nn"),
    ("nn: the direct conv's second thread group reads the first group's weights", "nn.cu",
     "reinterpret_cast<const float4*>(weights) + split * (DIRECT_OUT / 4);",
     "reinterpret_cast<const float4*>(weights);", "nn"),
    ("nn: the tensor-core conv stages its chunk's second half over the first", "nn.cu",
     "stage_band(tile + half * v.plane, in, v, s, c0 + half, count - half, oy0);",
     "stage_band(tile, in, v, s, c0 + half, count - half, oy0);", "nn"),
    ("nn: the direct conv stages every chunk from the first channel", "nn.cu",
     "const float* src = in + ((size_t)s * v.in_channels + c0) * v.in_h * v.in_w;",
     "const float* src = in + ((size_t)s * v.in_channels) * v.in_h * v.in_w;", "nn"),
    ("nn: the direct conv's band starts at its first row unstrided", "nn.cu",
     "const int y0 = oy0 * v.stride - v.pad_y;", "const int y0 = oy0 - v.pad_y;", "nn"),
    ("nn: the direct weight gradient reads a later tap block's channels from the tile's first", "nn.cu",
     "offset[i] = t <= taps ? (c - c0) * v.plane + ky * v.pitch + kx : 0;",
     "offset[i] = t <= taps ? c % v.chunk * v.plane + ky * v.pitch + kx : 0;", "nn"),
    ("nn: the direct bias gradient sums a column of halves", "nn.cu",
     "plane[i] = 1.0f;", "plane[i] = 0.5f;", "nn"),
    ("nn: the direct conv on the tensor cores drops the small·big product of 3xTF32", "nn.cu",
     "    mma_tf32(d, a_small, b_big);\n", "", "nn"),
    ("nn: the tensor-core conv at tf32 runs 3xTF32", "nn.cu",
     "if (v.tf32) conv2d_mma_with<true>(v, in, w, bias, out, epilogue);",
     "if (v.tf32) conv2d_mma_with<false>(v, in, w, bias, out, epilogue);", "nn"),
    ("nn: the conv's 16-byte staging copies the row above the input in place of its padding", "nn.cu",
     "const bool inside = (unsigned)iy < (unsigned)v.in_h;\n        cp_async16_or_zero(",
     "const bool inside = iy < v.in_h;\n        cp_async16_or_zero(", "nn"),
    ("nn: the direct conv on the tensor cores swaps its B fragments' two taps", "nn.cu",
     "const float b[2] = {load_shared(at_lo + offset[j]), load_shared(at_hi + offset[j])};",
     "const float b[2] = {load_shared(at_hi + offset[j]), load_shared(at_lo + offset[j])};", "nn"),
    ("nn: the direct forward on the tensor cores stores its rows gid + 8 at gid", "nn.cu",
     "(warp * MMA_TILES + i) * 16 + gid + r / 2 * 8] =", "(warp * MMA_TILES + i) * 16 + gid] =", "nn"),
    ("nn: the direct forward on the tensor cores reads every staged channel's taps from the first", "nn.cu",
     "offsets[k] = k < k_count ? 4 * (c * v.plane + ky * v.pitch", "offsets[k] = k < k_count ? 4 * (ky * v.pitch", "nn"),
    ("nn: the direct weight gradient on the tensor cores tables its positions' rows OW apart", "nn.cu",
     "at[p] = p < positions ? 4 * (r * v.pitch + p - r * v.out_w) * v.stride : 0;",
     "at[p] = p < positions ? 4 * (r * v.out_w + p - r * v.out_w) * v.stride : 0;", "nn"),
    ("nn: the direct weight gradient on the tensor cores reads its positions p + 4 at p", "nn.cu",
     "const unsigned at_hi = __float_as_uint(load_shared(at_k + 4 * k + 16));",
     "const unsigned at_hi = __float_as_uint(load_shared(at_k + 4 * k));", "nn"),
    ("nn: the direct weight gradient on the tensor cores reads dy's channels gid + 8 at gid", "nn.cu",
     "load_shared(dy_k + dy_below + 16)", "load_shared(dy_k + 16)", "nn"),
    ("nn: a convolution's fused activation stores the pre-activation", "nn.cu",
     "f.activated[e] = activate(ACT_RELU, value);", "f.activated[e] = value;", "nn"),
    ("nn: a direct input gradient's fused slope left out", "nn.cu",
     "return activation_slope(ACT_RELU, f.relu_out[e]);", "return 1.0f;", "nn"),
    ("nn: the weight gradient's slice sums leave out the first group's", "nn.cu",
     "float total = sums[0][column];", "float total = 0.0f;", "nn"),
    ("nn: the weight gradient's slice sums read db's slices at dw's stride", "nn.cu",
     "const size_t stride = in_a ? width_a : width_b;", "const size_t stride = width_a;", "nn"),
    ("nn: the tiled max-pool backward writes dy at every place of the window", "nn.cu",
     "window[ky * W + kx] = ky * kernel + kx == winner ? d : 0.0f;", "window[ky * W + kx] = d;", "nn"),
    ("nn: layer_norm's variance unbiased (over D − 1)", "nn.cu",
     "const float r = 1.0f / sqrtf(warp_sum(squares) / (float)D + eps);",
     "const float r = 1.0f / sqrtf(warp_sum(squares) / (float)(D > 1 ? D - 1 : 1) + eps);", "nn"),
    ("nn: layer_norm's dx without its mean(g·x̂) term", "nn.cu",
     "dx[base + j] = r * (g - sum_g - xhat * sum_gx);", "dx[base + j] = r * (g - sum_g);", "nn"),
    ("nn: layer_norm's weight and bias gradients leave out each part's last row", "nn.cu",
     "for (int r = part * rows_per_part; r < end; ++r) {", "for (int r = part * rows_per_part; r < end - 1; ++r) {",
     "nn"),
    ("nn: embedding reads id 0 as padding (a zero row)", "nn.cu",
     "out[e] = weight[(size_t)ids[e / D] * D + e % D];",
     "out[e] = ids[e / D] ? weight[(size_t)ids[e / D] * D + e % D] : 0.0f;", "nn"),
    ("nn: embedding's gradient leaves out each row's first id", "nn.cu",
     "for (int k = starts[v]; k < starts[v + 1]; ++k)", "for (int k = starts[v] + 1; k < starts[v + 1]; ++k)", "nn"),
    ("nn: dropout's mask shifted by one element", "nn.cu",
     "dropout_factor(key, (unsigned)i, threshold, scale)", "dropout_factor(key, (unsigned)i + 1u, threshold, scale)",
     "nn"),
    ("nn: attention's scores without the 1/sqrt(D) scale", "nn.cu", "        s *= scale;\n", "", "nn"),
    ("nn: attention's score gradient without the softmax's row term", "nn.cu",
     "g[u] = u < keys ? p[u] * (g[u] - dot) * scale : 0.0f;", "g[u] = u < keys ? p[u] * g[u] * scale : 0.0f;", "nn"),
    ("nn: attention's dk and dv leave out the diagonal query when causal", "nn.cu",
     "for (int t = causal ? u : 0; t < T; ++t) {", "for (int t = causal ? u + 1 : 0; t < T; ++t) {", "nn"),
    ("nn: bf16 products' operands truncated, not rounded to nearest", "nn.cu",
     "out[i] = to_bf16(x[i]);", "out[i] = (bf16)(__float_as_uint(x[i]) >> 16);", "nn"),
    ("nn: a split-k bf16 product's slices all read the first slice's k", "nn.cu",
     "const int k0 = slice * k_per, k_count", "const int k0 = 0, k_count", "nn"),
    ("nn: the fused residual add writes its first operand as the sum", "nn.cu",
     "            s[base + j] = v;", "            s[base + j] = x[base + j];", "nn"),
    ("nn: the activation epilogue applies the second column's activation to the first", "nn.cu",
     "v0 = unary_apply(ACT, v0);", "v0 = unary_apply(ACT, v1);", "nn"),
    ("nn: the device-id embedding gradient leaves out each part's last id", "nn.cu",
     "const int end = min(count, (q + 1) * per_part);", "const int end = min(count, (q + 1) * per_part - 1);", "nn"),
    ("nn: the device-id embedding gradient counts the padding row", "nn.cu",
     "        if (v != padding)\n", "", "nn"),
    ("nn: a Dropout layer's device counter does not advance", "nn.cu",
     "key[0] = dropout_key(site_seed, step);\n        step[0] += 1u;\n", "key[0] = dropout_key(site_seed, step);\n", "nn"),
    ("nn: clip_grad_norm scales the gradients up when their norm is below the limit", "nn.cu",
     "factor[0] = n > max_norm ? max_norm / n : 1.0f;", "factor[0] = max_norm / n;", "nn"),
    ("nn: a multi-tensor block whose chunk starts a tensor works on the tensor before", "nn.cu",
     "if (table.first_block[mid] <= block)", "if (table.first_block[mid] < block)", "nn"),
    ("nn: every chunk of a tensor in a multi-tensor launch is its first", "nn.cu",
     "begin = ((int)blockIdx.x - table.first_block[k]) * CHUNK;", "begin = 0 * CHUNK;", "nn"),
    ("nn: the optimizer's step counts advance for a table's first parameter only", "nn.cu",
     "for (int k = threadIdx.x; k < table.count; k += THREADS) table.steps[k][0] += 1.0f;",
     "for (int k = threadIdx.x; k < 1; k += THREADS) table.steps[k][0] += 1.0f;", "nn"),
    ("nn: the multi-tensor update gives every parameter the first one's weight decay", "nn.cu",
     "table.weight_decay[k],", "table.weight_decay[0],", "nn"),
    ("nn: each chunk's sum of squares leaves out its last element", "nn.cu",
     "for (int i = begin + threadIdx.x; i < end; i += THREADS) s += x[i] * x[i];",
     "for (int i = begin + threadIdx.x; i < end - 1; i += THREADS) s += x[i] * x[i];", "nn"),
    ("nn: clip_grad_norm's norm adds the first block's worth of partial sums only", "nn.cu",
     "for (int i = threadIdx.x; i < count; i += THREADS) total += (double)squares[i];",
     "for (int i = threadIdx.x; i < count && i < THREADS; i += THREADS) total += (double)squares[i];", "nn"),
    ("nn: clip_grad_norm's scale leaves each chunk's first element as it was", "nn.cu",
     "        out[i] = g;\n", "        out[i] = i == begin ? x[i] : g;\n", "nn"),
    ("nn: a linear layer's bias gradient sums x's first column, not ones", "nn.cu",
     "return i < K ? x[(size_t)r * K + i] : 1.0f;", "return i < K ? x[(size_t)r * K + i] : x[(size_t)r * K];", "nn"),
    ("nn: a linear backward's dx tiles all take the first column of tiles", "nn.cu",
     "block / dx_cols * T::BM, block % dx_cols * T::BN,", "block / dx_cols * T::BM, 0 * T::BN,", "nn"),
    ("nn: the backward's fused activation slope is left out of dx", "nn.cu",
     "dx[e] = act_pre ? v * unary_slope(act, act_pre[e], x[e]) : v;", "dx[e] = v;", "nn"),
    ("nn: the bf16 backward's fused activation slope reads the output for the pre-activation", "nn.cu",
     "v0 *= unary_slope(ACT, pre[e], x[e]);", "v0 *= unary_slope(ACT, x[e], x[e]);", "nn"),
    ("nn: cross-entropy's gradient is not divided by the rows", "nn.cu",
     "g[j] = (expf(x[j] - m) / sum - (j == t ? 1.0f : 0.0f)) * row_scale;",
     "g[j] = (expf(x[j] - m) / sum - (j == t ? 1.0f : 0.0f));", "nn"),
    ("nn: cross-entropy's mean leaves out the last row", "nn.cu",
     "for (int r = threadIdx.x; r < rows; r += THREADS) s += __ldcg(loss + r), c += __ldcg(counted + r);",
     "for (int r = threadIdx.x; r < rows - 1; r += THREADS) s += __ldcg(loss + r), c += __ldcg(counted + r);", "nn"),
    ("nn: the fused linear + cross-entropy's blocks leave out their last row's loss", "nn.cu",
     "row < min(m0 + T::BM, R); row += WARPS) {", "row < min(m0 + T::BM - 1, R); row += WARPS) {", "nn"),
    ("nn: the fused linear + cross-entropy's logits leave out the bias", "nn.cu",
     "const float v = bias ? acc + bias[o] : acc;", "const float v = acc;", "nn"),
    ("nn: the loss kernel's dx sums the outputs in one chain, not as the tile's groups do", "nn.cu",
     "part[j % KSPLIT][i] =\n                        fmaf(d_rows[(r0 + i) * LINEAR_CROSS_ENTROPY_CLASSES + o0 + j], w[j], part[j % KSPLIT][i]);",
     "part[0][i] =\n                        fmaf(d_rows[(r0 + i) * LINEAR_CROSS_ENTROPY_CLASSES + o0 + j], w[j], part[0][i]);", "nn"),
    ("nn: the loss kernel's dx leaves out the activation's slope", "nn.cu",
     "dx[e] = sum * unary_slope(act, act_pre[e], x[e]);", "dx[e] = sum;", "nn"),
    ("nn: the grouped weight gradients forget the bias column in a job's tiles", "nn.cu",
     "const int columns = (K + (table.db[k] ? 1 : 0) + T::BN - 1) / T::BN;",
     "const int columns = (K + T::BN - 1) / T::BN;", "nn"),
    ("transformer: a step's gradient sum starts from the last step's instead of the first micro-batch's",
     "transformer.cu", "sum[i] = first ? g[i] : sum[i] + g[i];", "sum[i] = sum[i] + g[i];", "transformer"),
    ("nn: the update reads each element's second moment from the element a block before", "nn.cu",
     "vi[j] = inside && v ? v[i] : 0.0f;", "vi[j] = inside && v ? v[i >= THREADS ? i - THREADS : i] : 0.0f;", "nn"),
    ("nn: the update's last block does not advance the step counts", "nn.cu",
     "    count_steps(table);\n    if (threadIdx.x == 0) ticket[0] = 0;", "    if (threadIdx.x == 0) ticket[0] = 0;", "nn"),
    ("nn: the fp32 linear's fused dropout keeps every element", "nn.cu",
     "if (dropped) dropped[e] = out * dropout_factor(key, (unsigned)e, threshold, drop_scale);",
     "if (dropped) dropped[e] = out;", "nn"),
    ("nn: the bf16 dropout epilogue gives a pair's second column the first one's mask", "nn.cu",
     "v1 *= dropout_factor(key, (unsigned)e + 1u, threshold, drop_scale);",
     "v1 *= dropout_factor(key, (unsigned)e, threshold, drop_scale);", "nn"),
    ("lr x 1.001 on b1 (single-sample backward)", "text_sample.cu",
     "b1[j] = bias - lr * dz_j;", "b1[j] = bias - 1.001f * lr * dz_j;", "text"),
    ("id 0 (<unk>) read as padding in a tiled batch's contexts", "text_batch.cu",
     "for (int n = 0; n < N; ++n) sum += E[(size_t)tokens[pos - N + n] * D + d];",
     "for (int n = 0; n < N; ++n) if (tokens[pos - N + n] != 0) sum += E[(size_t)tokens[pos - N + n] * D + d];", "text"),
    ("last sample of a tiled batch dropped from dz1", "text_batch.cu",
     "if (hidden[i] <= 0.0f) return 0.0f;", "if (hidden[i] <= 0.0f || s == B - 1) return 0.0f;", "text"),
    ("bf16 step: the b2 gradient sums half of each chunk's samples", "text_batch.cu",
     "for (int k = 0; k < T::BK / 2; ++k) row_sum", "for (int k = 0; k < T::BK / 4; ++k) row_sum", "text"),
    ("bf16 step: every dH split reads W2 from its first row", "text_batch.cu",
     "dlogits + k0, ldg, w2_bf16 + (size_t)k0 * H, H,", "dlogits + k0, ldg, w2_bf16, H,", "text"),
    ("bf16 step: G not divided by the batch", "text_batch.cu",
     "make_float4(st.max, inv_b / st.sum,", "make_float4(st.max, 1.0f / st.sum,", "text"),
    ("bf16 step: W2's bf16 copy left stale by the SGD update", "text_batch.cu",
     "            if (w2_bf16) w2_bf16[i] = to_bf16(W2[i]);\n", "", "text"),
    ("staged W2 tile read one row off", "text.cu",
     "w[i] = lane + 32 * i < H ? ws[tile_r * H + lane + 32 * i] : 0.0f;",
     "w[i] = lane + 32 * i < H ? ws[(tile_r > 0 ? tile_r - 1 : 0) * H + lane + 32 * i] : 0.0f;", "text"),
    ("ReLU' mask missing on hidden unit 0 (single-sample backward)", "text_sample.cu",
     "const float dz_j = z > 0.0f ? dh_j : 0.0f;", "const float dz_j = (z > 0.0f || j == 0) ? dh_j : 0.0f;", "text"),
    ("pending W2 update never flushed", "text_sample.cu",
     "if (!rec.pending) return;\n    const int G = gridDim.x;", "return;\n    const int G = gridDim.x;", "text"),
    ("embedding update divided by N + 1 (tiled step)", "text_batch.cu",
     "const float scale = fused_sgd ? -lr / N : 1.0f / N;", "const float scale = fused_sgd ? -lr / (N + 1) : 1.0f / N;", "text"),
    ("Adam without bias correction", "optim.cuh",
     "return theta - s.lr * (m / s.bias1) / (sqrtf(v / s.bias2) + s.eps);", "return theta - s.lr * m / (sqrtf(v) + s.eps);",
     "fit"),
    ("dense embedding gradient not cleared between optimizer steps", "text_batch.cu",
     "if (k < 3) grads[k][i] = 0.0f;", "if (k > 0 && k < 3) grads[k][i] = 0.0f;", "text"),
    ("pooled gradient routed to a non-positive winner (CNN backward)", "mnist_cnn.cu",
     "        if (f[i] > 0.0f) {", "        if (f[i] >= 0.0f) {", "mnist"),
    ("conv1 bias gradient halved (CNN update)", "mnist_cnn.cu", "                acc[9] += g;", "                acc[9] += 0.5f * g;", "mnist"),
    ("padding units learn (xor, sigmoid)", "xor.cu", "        if (unit) {\n            u0 -= lr * g0;",
     "        if (true) {\n            u0 -= lr * g0;", "xor"),
    ("every epoch at the first epoch's rate (xor)", "xor.cu", "const float lr = rates[epoch];",
     "const float lr = rates[0];", "xor"),
    ("pending W2 update at the applying step's rate, not its own (single-sample forward)", "text_sample.cu",
     "const PendingStep rec = {raw.x, raw.y, __uint_as_float(raw.z), raw.w};",
     "const PendingStep rec = {raw.x, raw.y, lr, raw.w};", "text"),
    ("update at the next step's rate (CNN)", "mnist_cnn.cu", "OptimStep s = optim_step(optim, *lr);",
     "OptimStep s = optim_step(optim, lr[1]);", "mnist"),
    ("attention backward: dk without the 1/sqrt(hs) scale", "attention.cuh", "row[C] = dk[nb][i][jj] * scale;", "row[C] = dk[nb][i][jj];",
     "transformer"),
    ("LayerNorm backward without its mean(g*xhat) term", "layernorm.cuh",
     "const float dx = rstd * (g[i] - sum_g - xhat[i] * sum_gx);", "const float dx = rstd * (g[i] - sum_g);", "transformer"),
    ("GELU slope without the tanh derivative", "activations.cuh",
     "return 0.5f * (1.0f + th) + 0.5f * z * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_C * z2);",
     "return 0.5f * (1.0f + th);", "transformer"),
    ("AdamW's decay applied twice", "optim.cuh", "theta *= 1.0f - s.lr * s.weight_decay;",
     "theta *= 1.0f - 2.0f * s.lr * s.weight_decay;", "transformer"),
    ("a last-block sum of partials leaves out the last (weight and LayerNorm gradients)", "common.cuh",
     "for (int k = 0; k < count; ++k)", "for (int k = 0; k < count - 1; ++k)", "transformer"),
    ("bf16 weight gradient: the bias sum skips half of each chunk's rows", "transformer.cu",
     "for (int r = threadIdx.x / WG_BM; r < L::BK; r += SHARES)",
     "for (int r = threadIdx.x / WG_BM; r < L::BK; r += 2 * SHARES)", "transformer"),
    ("bf16 branch gradient written without its dropout mask", "transformer.cu",
     "d_branch_bf16[e] = to_bf16(dres[e] * drop.factor(e));", "d_branch_bf16[e] = to_bf16(dres[e]);", "transformer"),
    ("TF32 mma: A fragment's second register from the wrong row", "gemm.cuh",
     "a[i][1] = to_tf32(As[(k + tig) * LDA + m + 8]);", "a[i][1] = to_tf32(As[(k + tig) * LDA + m]);", "transformer"),
    ("bf16 operands truncated instead of rounded to nearest", "common.cuh",
     "cvt.rn.bf16x2.f32 %0, %1, %2;", "cvt.rz.bf16x2.f32 %0, %1, %2;", "matmul"),
    ("bf16 async tile: a 16-byte segment holding B's ones column copied from memory", "gemm.cuh",
     "(unsigned)(ones - o) >= 8u", "(unsigned)(ones - o) >= 1u", "matmul"),
    ("wgmma: a chunk whose rows lie along m or n stored without its swizzle", "gemm_wgmma.cuh",
     ": o / 64 * 4096 + k * 64 + (o % 64 / 8 ^ (k & 7)) * 8 + o % 8;", ": o / 64 * 4096 + k * 64 + o % 64;",
     "transformer"),
    ("wgmma: B's k-contiguous chunk read 16 k behind (descriptor)", "gemm_wgmma.cuh",
     "wgmma_descriptor<B_K>(As + G::A_CHUNK + wgmma_chunk_offset<B_K>(0, ks))",
     "wgmma_descriptor<B_K>(As + G::A_CHUNK + wgmma_chunk_offset<B_K>(0, ks > 0 ? ks - 16 : 0))", "transformer"),
    ("bf16 attention forward: one future key let through the causal mask", "flash_attention.cuh",
     "s[n][i] = inside || (u <= t && u < len) ? s[n][i] * scale_log2 : NEG_INF;",
     "s[n][i] = inside || (u <= t + 1 && u < len) ? s[n][i] * scale_log2 : NEG_INF;", "transformer"),
    ("bf16 attention forward: running sum not rescaled by the online softmax", "flash_attention.cuh",
     "l[r] = l[r] * alpha[r] + sum[r];", "l[r] = l[r] + sum[r];", "transformer"),
    ("bf16 attention dq: the diagonal left out of the mask", "flash_attention.cuh",
     "p[n][i] = inside || (u <= t && u < len) ? exp2f(p[n][i] * scale_log2 - lse_r[i >> 1]) : 0.0f;",
     "p[n][i] = inside || (u < t && u < len) ? exp2f(p[n][i] * scale_log2 - lse_r[i >> 1]) : 0.0f;", "transformer"),
    ("attention dropout mask redrawn with t and u swapped in the backward pass", "attention.cuh",
     "keep = dropout_factor(drop_key, first + (unsigned)((t0 + r) * T + u0 + j), drop_threshold, drop_scale);",
     "keep = dropout_factor(drop_key, first + (unsigned)((u0 + j) * T + t0 + r), drop_threshold, drop_scale);",
     "transformer"),
    ("token embedding gradient: the last slice of rows left out", "transformer.cu",
     "for (int k = 0; k < slices; ++k) s += __ldcg(&partials[((size_t)v * slices + k) * C + c]);",
     "for (int k = 0; k < slices - 1; ++k) s += __ldcg(&partials[((size_t)v * slices + k) * C + c]);", "transformer"),
    ("fp32 forward in halves of k: the other half's tile left out", "transformer.cu",
     "out[row + n] = (v + __ldcg(theirs + row + n)) + __ldg(bias + n);", "out[row + n] = v + __ldg(bias + n);",
     "transformer"),
    ("fp32 weight gradient: the bias sum leaves out each thread's fourth output", "gemm.cuh",
     "            sums.w += v.w;\n", "", "transformer"),
    ("gemm_128 matrix operand: a k-contiguous row's second and third k swapped", "gemm.cuh",
     "            chunk[G128_LD] = v.y;\n            chunk[2 * G128_LD] = v.z;",
     "            chunk[G128_LD] = v.z;\n            chunk[2 * G128_LD] = v.y;", "transformer"),
    ("dropout mask left out of the dense backward (fit)", "fit.cu",
     "        if (d.drop) g *= dropout_factor(key, (unsigned)e, threshold, scale);\n", "", "fit"),
    ("dense bias gradient halved (fit)", "fit.cu", "                else gb[o] = g;\n                sq += g * g;",
     "                else gb[o] = 0.5f * g;\n                sq += g * g;", "fit"),
    ("conv input gradient ignores the stride (fit)", "fit.cu",
     "if (ty < 0 || ty % S != 0 || ty / S >= OH) continue;", "if (ty < 0 || ty / S >= OH) continue;", "fit"),
    ("max-pool gradient to every input of the window (fit)", "fit.cu",
     "if (winner[o] == (unsigned)i) d = dy[o];", "d = dy[o];", "fit"),
    ("conv weight gradient of the last run of samples left out (fit)", "fit.cu",
     "for (int r = lane; r < runs; r += 32) g += partial", "for (int r = lane; r < runs - 1; r += 32) g += partial", "fit"),
    ("fused loss: the layer before's gradient from the first sample's (fit)", "fit.cu",
     "acc = fmaf(grad[s][o], W[(size_t)o * d.inputs + k], acc);",
     "acc = fmaf(grad[0][o], W[(size_t)o * d.inputs + k], acc);", "fit"),
    ("generic dense: the forward stages 40 deep, whose thread groups then sum in another order (fit)", "fit.cu",
     "static constexpr int forward_depth = FWD_BK, loss_depth = LOSS_BK;",
     "static constexpr int forward_depth = 40, loss_depth = LOSS_BK;", "fit"),
    ("generic dense: the loss kernel takes the fused layer's bias as absent (fit)", "fit.cu",
     "dense_forward_loss<BN, loss_tn(BN)>(d, DENSE_FORWARD_LOSS_ARGS);",
     "dense_forward_loss<BN, loss_tn(BN)>(DenseDims{d.inputs, d.outputs, d.act, 0, d.drop, d.loss}, DENSE_FORWARD_LOSS_ARGS);", "fit"),
    ("whole epoch: the last warp's gradient left out of the sum (fit)", "fit.cu",
     "for (int w = 0; w < WARPS; ++w) g += smem[SMEM_PARTIAL + w * PS + i];",
     "for (int w = 0; w < WARPS - 1; ++w) g += smem[SMEM_PARTIAL + w * PS + i];", "fit"),
    ("whole epoch: backward without the activation's slope (fit)", "fit.cu",
     "                if (S.act != ACT_NONE) d *= fit_slope(S.act, z[q][v]);\n",
     "", "fit"),
    ("nn: the fused loss walks its logits 16 columns at a time with the 8-wide tile", "nn.cu",
     "gemm_tile<L::BM, L::BN, L::BK, L::TM, L::TN, false, true>(",
     "gemm_tile<T::BM, T::BN, T::BK, T::TM, T::TN, false, true>(", "nn"),
]


def run(binary, fused, name, file, old, new, only, seed):
    work = tempfile.mkdtemp(prefix="textnet-mutant-")
    try:
        shutil.copytree(fused, work, dirs_exist_ok=True)
        if file:
            path = os.path.join(work, file)
            text = open(path).read()
            if text.count(old) != 1:
                return {"mutation": name, "error": f"the text to mutate occurs {text.count(old)} times in {file}"}
            open(path, "w").write(text.replace(old, new))
        env = dict(os.environ, TEXTNET_FUSED_DIR=work)
        cmd = [binary, "selftest", "--quick", "--json", "--seed", str(seed)] + (["--only", only] if only else [])
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        try:
            report = json.loads(p.stdout)
            # A relative error that is not finite comes as null.
            error = lambda c: "inf" if c["rel_error"] is None else f"{c['rel_error']:.3e}"
            failed = [f"{c['kernel']} [{c['shape']}] {error(c)}" for c in report["checks"] if not c["pass"]]
            total = len(report["checks"])
        except (json.JSONDecodeError, KeyError):
            failed, total = [], 0
        return {"mutation": name, "exit": p.returncode, "checks": total, "failed": failed,
                "stderr": p.stderr.strip().splitlines()[-1:] if p.returncode else []}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="target/release/textnet")
    ap.add_argument("--fused", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fused"))
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--seed", type=int, default=random.getrandbits(63))
    ap.add_argument("--out", help="write the results as JSON lines here too")
    ap.add_argument("names", nargs="*", help="run only mutations whose name contains one of these")
    a = ap.parse_args()
    chosen = [m for m in MUTATIONS if not a.names or any(n in m[0] for n in a.names)]
    print(f"seed {a.seed}; control plus {len(chosen)} mutations, {a.jobs} at a time", flush=True)
    # The control runs the parts the chosen mutations run (all of the selftest when they span several).
    parts = {m[4] for m in chosen}
    control_part = parts.pop() if len(parts) == 1 else None
    jobs = [("control: fused/ unchanged", None, None, None, control_part)] + chosen
    with ThreadPoolExecutor(a.jobs) as pool:
        results = list(pool.map(lambda m: run(a.bin, a.fused, *m, a.seed), jobs))
    bad = 0
    for i, r in enumerate(results):
        if "error" in r:
            verdict, bad = "ERROR: " + r["error"], bad + 1
        elif i == 0:
            ok = r["exit"] == 0 and r["checks"] > 0
            verdict = f"passes, {r['checks']} checks" if ok else f"FAILS (exit {r['exit']}): {r['failed'][:3]} {r['stderr']}"
            bad += not ok
        else:
            caught = r["exit"] != 0
            verdict = (f"caught: {len(r['failed'])} of {r['checks']} checks fail, e.g. {r['failed'][:2]}" if r["failed"]
                       else f"caught: exit {r['exit']} {r['stderr']}") if caught else "SURVIVED: the selftest passed"
            bad += not caught
        print(f"{r['mutation']}: {verdict}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    print(f"{len(results) - 1} mutations: {'all caught' if bad == 0 else f'{bad} problem(s)'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
