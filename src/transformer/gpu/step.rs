//! One training step's passes in stream order: the forward pass (embedding, blocks of LayerNorm, attention
//! and MLP with their residual adds, the classifier and its loss) and the backward pass in reverse, each a
//! launch of fused/transformer.cu. The step around them, its micro-batches and its update: `update.rs`.

use super::{
    EMBEDDING_SLICE_ROWS, GpuTransformer, LinearTiles, Operand, THREADS, TICKET_CLASSIFIER, TICKET_LAYERNORM, TMA_TILE,
    Tiles, WARPS, ln_rows_per_warp, tma_shared_bytes,
};
use crate::device::kernel_struct::DropoutArgs;
use crate::device::launch::{Arg, Kernel, StructArg};
use crate::device::precision::Precision;
use crate::device::tma::{TMA_THREADS, TmaOperand, tma_operands};
use crate::ops::gemm::Strided;
use crate::transformer::model::{EMBEDDING_SITE, attention_site};
use anyhow::Result;
use cudarc::driver::CudaSlice;
use std::collections::hash_map::Entry;

/// A null pointer: an output a kernel skips.
pub(super) const NULL: Arg = Arg::Ptr(0);

/// A product C = op(A)·op(B) of bf16 operands (device addresses and how they lie), M×N over K.
struct TmaProduct {
    a: (Arg, Strided),
    b: (Arg, Strided),
    m: usize,
    n: usize,
    k: usize,
}

/// A TMA kernel, its launch shape ((blocks, 1), threads, shared bytes, programmatic) and its maps.
type TmaLaunch<'k> = (&'k Kernel, ((u32, u32), u32, u32, bool), StructArg);

impl GpuTransformer {
    pub(super) fn bf16(&self) -> bool {
        self.precision == Precision::Bf16
    }

    /// Whether this GPU's kernels have `wgmma` (the bf16 tiles then take more shared memory).
    fn wgmma(&self) -> bool {
        crate::device::compile::has_wgmma(self.gpu.compute_capability)
    }

    /// An activation's buffers as a linear layer's operand: [fp32, bf16].
    fn operand(&self, op: &Operand) -> [Arg; 2] {
        [self.buf(&op.fp32), self.buf(&op.bf16)]
    }

    /// Where the kernel that computes an activation writes it, [fp32, bf16]: fp32 unless the step runs in
    /// bf16 (then only for the checks), the bf16 copy in bf16.
    fn outputs(&self, op: &Operand) -> [Arg; 2] {
        let fp32 = !self.bf16() || self.fp32_activations;
        [if fp32 { self.buf(&op.fp32) } else { NULL }, if self.bf16() { self.buf(&op.bf16) } else { NULL }]
    }

    /// A LayerNorm's saved statistics: μ and r of each row, the two halves of `stats`.
    fn stats(&self, stats: &CudaSlice<f32>) -> [Arg; 2] {
        let p = self.ptr(stats);
        [Arg::Ptr(p), Arg::Ptr(p + 4 * self.rows() as u64)]
    }

    /// x_out = x_in + delta (with site `site`'s dropout on delta when `training`), then LayerNorm `ln` of it
    /// into `out` (as `outputs`) and `stats`: a residual branch joining the stream and the next LayerNorm in
    /// one launch.
    fn residual_layernorm(
        &self,
        [x_in, delta, x_out]: [&CudaSlice<f32>; 3],
        ln: &str,
        (out, stats): (&Operand, &CudaSlice<f32>),
        site: usize,
        training: bool,
    ) -> Result<()> {
        let n = self.rows();
        let inputs = [self.buf(x_in), self.buf(delta), self.buf(x_out), Arg::i32(n as i32)];
        let weights = [self.param(&format!("{ln}.weight")), self.param(&format!("{ln}.bias"))];
        let args = [&inputs[..], &weights, &self.outputs(out), &self.stats(stats)].concat();
        self.launch_site(
            &self.kernels.residual_layernorm,
            n.div_ceil(WARPS),
            0,
            self.dropout_site(site, training),
            &args,
        )
    }

    /// out = input·Wᵀ + b of `layer` (with `pre`, out = GELU(pre)), from input's buffer of this step's
    /// precision ([fp32, bf16]) into out's ([fp32, bf16], either null; the fp32 kernel writes fp32 only).
    pub(super) fn linear_forward(
        &self,
        input: [Arg; 2],
        layer: &str,
        out: [Arg; 2],
        pre: Arg,
        out_features: usize,
        in_features: usize,
    ) -> Result<()> {
        let n = self.rows();
        let (weight, bias) = (format!("{layer}.weight"), self.param(&format!("{layer}.bias")));
        let sizes = [Arg::i32(n as i32), Arg::i32(out_features as i32), Arg::i32(in_features as i32)];
        let small = self.small_tiles();
        let tiles = LinearTiles::of(self.precision, self.wgmma(), small);
        let grid = (out_features.div_ceil(tiles.bn) as u32, n.div_ceil(tiles.bm) as u32);
        let gemm_128 = self.precision == Precision::Fp32 && !small;
        if gemm_128 && matches!(pre, Arg::Ptr(0)) && Self::forward_halves(&self.gpu, n, out_features, in_features) {
            let b = &self.buffers;
            let buffers = [self.buf(&b.linear_other_half), self.buf(&b.linear_tickets)];
            let args = [&[input[0], self.param(&weight), bias, out[0]][..], &buffers, &sizes].concat();
            let grid = (grid.0, 2 * grid.1);
            return self.gpu.launch(&self.kernels.linear_forward_halves, grid, tiles.shared_bytes as u32, false, &args);
        }
        if self.bf16() {
            // A = in (n × in_features), B = W stored out_features × in_features.
            let a = Strided { trans: false, ld: in_features };
            let b = Strided { trans: true, ld: in_features };
            let product = TmaProduct {
                a: (input[1], a),
                b: (self.param_bf16(&weight), b),
                m: n,
                n: out_features,
                k: in_features,
            };
            if let Some((kernel, shape, maps)) = self.tma_product(self.kernels.linear_forward_tma.as_ref(), product)? {
                let args = [&[bias, out[0], out[1], pre][..], &sizes].concat();
                return self.gpu.launch_sized_with_struct(kernel, shape, &maps, &args);
            }
        }
        let (kernel, args) = if self.bf16() {
            let args = [&[input[1], self.param_bf16(&weight), bias, out[0], out[1], pre][..], &sizes].concat();
            (&self.kernels.linear_forward_bf16, args)
        } else if gemm_128 {
            let args = [&[input[0], self.param(&weight), bias, out[0], pre][..], &sizes].concat();
            (&self.kernels.linear_forward, args)
        } else {
            let tf32 = Arg::i32((self.precision == Precision::Tf32) as i32);
            let args = [&[input[0], self.param(&weight), bias, out[0], pre][..], &sizes, &[tf32]].concat();
            (&self.kernels.linear_forward_small, args)
        };
        self.gpu.launch(kernel, grid, tiles.shared_bytes as u32, false, &args)
    }

    /// `kernel` (a TMA product on [`TMA_TILE`]) for `product`, its launch shape and its operands' maps (each
    /// encoded once, then kept); None where the pipeline does not run (no `wgmma`, `TEXTNET_TMA=0`, or
    /// `Tiles::NoTma`) or TMA cannot copy an operand (a leading dimension not a multiple of 8, a start not
    /// 16-byte aligned): the caller's gemm_tile_bf16_wgmma kernel then runs it.
    fn tma_product<'k>(
        &self,
        kernel: Option<&'k Kernel>,
        TmaProduct { a: (a, a_layout), b: (b, b_layout), m, n, k }: TmaProduct,
    ) -> Result<Option<TmaLaunch<'k>>> {
        let tile = TMA_TILE;
        let (true, Some(kernel), Arg::Ptr(a), Arg::Ptr(b)) = (self.tiles != Tiles::NoTma, kernel, a, b) else {
            return Ok(None);
        };
        let operands = [TmaOperand::a(a, a_layout, m, k, tile), TmaOperand::b(b, b_layout, n, k, tile)];
        if m == 0 || n == 0 || !operands.iter().all(TmaOperand::copyable) {
            return Ok(None);
        }
        let mut maps = self.tma_maps.lock().unwrap_or_else(|p| p.into_inner());
        let mut encoded = [[0u8; 128]; 2];
        for (operand, out) in operands.iter().zip(&mut encoded) {
            *out = match maps.entry(*operand) {
                Entry::Occupied(map) => *map.get(),
                Entry::Vacant(slot) => *slot.insert(operand.encode()?),
            };
        }
        let shape = ((tile.blocks(m, n, self.gpu.sm_count), 1), TMA_THREADS, tma_shared_bytes() as u32, false);
        Ok(Some((kernel, shape, tma_operands(&encoded[0], &encoded[1]))))
    }

    /// Which GEMM the linear layers' products run on at this precision, for the benches' reports.
    pub fn linear_gemm(&self) -> &'static str {
        match self.precision {
            Precision::Bf16 if self.kernels.linear_forward_tma.is_some() && self.tiles != Tiles::NoTma => {
                "bf16 forward products on the TMA pipeline (gemm_bf16_tma_tiles, persistent, wgmma, results by \
                 rows), the backward's on gemm_tile_bf16_wgmma"
            }
            Precision::Bf16 if self.wgmma() => "bf16 on gemm_tile_bf16_wgmma (cp.async, wgmma)",
            Precision::Bf16 => "bf16 on gemm_tile_bf16_async (cp.async, mma.sync)",
            Precision::Tf32 => "tf32 on gemm_tile_tf32",
            Precision::Fp32 if self.small_tiles() => "fp32 on gemm_tile",
            Precision::Fp32 => "fp32 on gemm_128",
        }
    }

    /// dW, db of `layer` from dy and its input x, and dx = dy·W (× GELU′(pre)) into dx's buffers; each
    /// [fp32, bf16] as `linear_forward`'s. `dy_ld`: the row stride of dy's bf16 copy.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn linear_backward(
        &self,
        dy: [Arg; 2],
        dy_ld: usize,
        x: [Arg; 2],
        layer: &str,
        out_features: usize,
        in_features: usize,
        dx: [Arg; 2],
        pre: Arg,
    ) -> Result<()> {
        let n = self.rows();
        let small = self.small_tiles();
        let t = LinearTiles::of(self.precision, self.wgmma(), small);
        let tiles = t.wgrad_tiles(out_features, in_features);
        let slices = Self::slices(&self.gpu, tiles, t.wg_bm * t.wg_bn, n);
        let writes_dx = !matches!(dx[0], Arg::Ptr(0)) || (self.bf16() && !matches!(dx[1], Arg::Ptr(0)));
        let weight = format!("{layer}.weight");
        let dx_blocks = if writes_dx { in_features.div_ceil(t.bn) * n.div_ceil(t.bm) } else { 0 };
        let b = &self.buffers;
        let sizes = [
            Arg::i32(n as i32),
            Arg::i32(out_features as i32),
            Arg::i32(in_features as i32),
            Arg::i32(slices as i32),
            self.grad_of(&weight),
            self.grad_of(&format!("{layer}.bias")),
            self.buf(&b.linear_partials),
            self.buf(&b.linear_tickets),
        ];
        let (kernel, args) = if self.bf16() {
            let operands = [dy[1], Arg::i32(dy_ld as i32), x[1], self.param_bf16(&weight)];
            (&self.kernels.linear_backward_bf16, [&operands[..], &sizes, &[dx[0], dx[1], pre]].concat())
        } else if self.precision == Precision::Fp32 && !small {
            // gemm_128
            let args = [&[dy[0], x[0], self.param(&weight)][..], &sizes, &[dx[0], pre]].concat();
            (&self.kernels.linear_backward, args)
        } else {
            let tf32 = Arg::i32((self.precision == Precision::Tf32) as i32);
            let args = [&[dy[0], x[0], self.param(&weight)][..], &sizes, &[dx[0], pre, tf32]].concat();
            (&self.kernels.linear_backward_small, args)
        };
        self.launch(kernel, tiles * slices + dx_blocks, t.shared_bytes, &args)
    }

    /// The backward pass of LayerNorm `ln` (x its input, stats its saved μ and r) into d_res; in bf16, with
    /// `branch` (the dropout site of the residual branch before it), that branch's bf16 gradient too.
    pub(super) fn layernorm_backward(
        &self,
        x: Arg,
        stats: &CudaSlice<f32>,
        ln: &str,
        accumulate: bool,
        branch: Option<usize>,
    ) -> Result<()> {
        let n = self.rows();
        let b = &self.buffers;
        let (d_branch_bf16, dropout) = match branch {
            Some(site) if self.bf16() => (self.buf(&b.d_branch_bf16), self.dropout_site(site, true)),
            _ => (NULL, DropoutArgs::off()),
        };
        let [mean, rstd] = self.stats(stats);
        let args = [
            x,
            mean,
            rstd,
            self.param(&format!("{ln}.weight")),
            self.buf(&b.d_ln),
            self.buf(&b.d_res),
            Arg::i32(accumulate as i32),
            Arg::i32(n as i32),
            self.grad_of(&format!("{ln}.weight")),
            self.grad_of(&format!("{ln}.bias")),
            self.buf(&b.ln_partials),
            Arg::Ptr(self.ptr(&self.tickets) + 4 * TICKET_LAYERNORM as u64),
        ];
        let rows_per_warp = ln_rows_per_warp(n, self.gpu.sm_count as usize);
        let args = [&args[..], &[d_branch_bf16, Arg::i32(rows_per_warp as i32)]].concat();
        self.launch_site(&self.kernels.layernorm_backward, n.div_ceil(WARPS * rows_per_warp), 0, dropout, &args)
    }

    /// The forward pass of the batch at `offsets` (device pointer to `batch` offsets into `data`), ending
    /// with the classifier: row losses, dlogits scaled by `scale`, the loss sum of the first `counted`
    /// rows added to `loss_sum`. Dropout only when `training`.
    pub(super) fn enqueue_forward(
        &self,
        data: Arg,
        offsets: Arg,
        scale: f32,
        counted: usize,
        loss_sum: Arg,
        training: bool,
    ) -> Result<()> {
        let c = &self.config;
        let n = self.rows();
        let (e, f) = (c.embed, c.ffn());
        let b = &self.buffers;
        let row_blocks = n.div_ceil(WARPS);
        let [m0, r0] = self.stats(&b.blocks[0].ln1_stats);
        let [ln1, ln1_bf16] = self.outputs(&b.blocks[0].ln1);
        self.launch_site(
            &self.kernels.embed_layernorm,
            row_blocks,
            0,
            self.dropout_site(EMBEDDING_SITE, training),
            &[
                data,
                offsets,
                Arg::i32(n as i32),
                self.param("tok_emb.weight"),
                self.param("pos_emb.weight"),
                self.buf(&b.blocks[0].x),
                self.param("blocks.0.ln1.weight"),
                self.param("blocks.0.ln1.bias"),
                ln1,
                ln1_bf16,
                m0,
                r0,
            ],
        )?;
        for l in 0..c.layers {
            let a = &b.blocks[l];
            let p = format!("blocks.{l}");
            let site = attention_site(l);
            let qkv = [self.buf(&a.qkv), NULL];
            self.linear_forward(self.operand(&a.ln1), &format!("{p}.attn.qkv"), qkv, NULL, 3 * e, e)?;
            if let Some(flash) = self.flash_attention() {
                let dropout = self.dropout_site(site, training);
                flash.forward(
                    &self.gpu,
                    self.buf(&a.qkv),
                    self.operand(&a.y),
                    self.buf(&a.lse),
                    b.batch,
                    c.heads,
                    c.block,
                    dropout,
                )?;
            } else {
                self.launch_site(
                    &self.kernels.attention_forward,
                    b.batch * c.heads,
                    self.attention_forward_shared,
                    self.dropout_site(site, training),
                    &[self.buf(&a.qkv), self.buf(&a.y.fp32), self.buf(&a.lse), Arg::i32(c.heads as i32)],
                )?;
            }
            let attn_out = [self.buf(&a.attn_out), NULL];
            self.linear_forward(self.operand(&a.y), &format!("{p}.attn.proj"), attn_out, NULL, e, e)?;
            let ln2 = (&a.ln2, &a.ln2_stats);
            self.residual_layernorm([&a.x, &a.attn_out, &a.x_attn], &format!("{p}.ln2"), ln2, site + 1, training)?;
            let (gelu, u) = (self.outputs(&a.gelu), self.buf(&a.u));
            self.linear_forward(self.operand(&a.ln2), &format!("{p}.mlp.fc"), gelu, u, f, e)?;
            let mlp_out = [self.buf(&a.mlp_out), NULL];
            self.linear_forward(self.operand(&a.gelu), &format!("{p}.mlp.proj"), mlp_out, NULL, e, f)?;
            let last = l + 1 == c.layers;
            let (next_x, next_ln, next_stats, ln) = if last {
                (&b.x_final, &b.lnf, &b.lnf_stats, "ln_f".to_string())
            } else {
                let nb = &b.blocks[l + 1];
                (&nb.x, &nb.ln1, &nb.ln1_stats, format!("blocks.{}.ln1", l + 1))
            };
            let next = (next_ln, next_stats);
            self.residual_layernorm([&a.x_attn, &a.mlp_out, next_x], &ln, next, site + 2, training)?;
        }
        self.linear_forward(self.operand(&b.lnf), "head", [self.buf(&b.logits), NULL], NULL, c.vocab, e)?;
        let d_logits_bf16 = if self.bf16() && training { self.buf(&b.d_logits_bf16) } else { NULL };
        self.launch(
            &self.kernels.classifier,
            row_blocks,
            0,
            &[
                self.buf(&b.logits),
                data,
                offsets,
                Arg::i32(n as i32),
                Arg::i32(c.vocab as i32),
                Arg::f32(scale),
                self.buf(&b.row_loss),
                Arg::i32(counted as i32),
                Arg::Ptr(self.ptr(&self.tickets) + 4 * TICKET_CLASSIFIER as u64),
                loss_sum,
                d_logits_bf16,
                Arg::i32(Self::logits_ld(c) as i32),
            ],
        )
    }

    /// d_branch = dropout mask of `site` ⊙ d_res: the gradient of a residual branch (into d_ln, free
    /// between its LayerNorm backward passes). Without dropout the branch's gradient is d_res itself.
    fn branch_gradient(&self, site: usize) -> Result<Arg> {
        let b = &self.buffers;
        if self.dropout == 0.0 {
            return Ok(self.buf(&b.d_res));
        }
        let n = self.rows() * self.config.embed;
        let args = [self.buf(&b.d_res), self.buf(&b.d_ln), Arg::i32(n as i32)];
        let blocks = n.div_ceil(THREADS).min(8 * self.gpu.sm_count as usize);
        self.launch_site(&self.kernels.dropout_backward, blocks, 0, self.dropout_site(site, true), &args)?;
        Ok(self.buf(&b.d_ln))
    }

    /// The backward pass after `enqueue_forward` (training data at `offsets`): every gradient, written.
    pub(super) fn enqueue_backward(&self, offsets: Arg) -> Result<()> {
        self.enqueue_backward_in_buckets(offsets, &mut |_| Ok(()))
    }

    /// `enqueue_backward`, calling `written(b)` once the launches that write bucket b of
    /// `gradient_buckets` are enqueued (b = 0, 1, … in that order), for data parallelism to reduce it
    /// while the rest of the pass runs.
    pub(super) fn enqueue_backward_in_buckets(
        &self,
        offsets: Arg,
        written: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<()> {
        let c = &self.config;
        let n = self.rows();
        let (e, f) = (c.embed, c.ffn());
        let b = &self.buffers;
        let bf16 = self.bf16();
        let d_ln = [self.buf(&b.d_ln), NULL];
        // A residual branch's gradient: in bf16 its LayerNorm backward pass wrote it already.
        let branch = |site: usize| -> Result<[Arg; 2]> {
            Ok(if bf16 { [NULL, self.buf(&b.d_branch_bf16)] } else { [self.branch_gradient(site)?, NULL] })
        };
        let d_logits = [self.buf(&b.logits), self.buf(&b.d_logits_bf16)];
        self.linear_backward(d_logits, Self::logits_ld(c), self.operand(&b.lnf), "head", c.vocab, e, d_ln, NULL)?;
        let last_mlp = attention_site(c.layers - 1) + 2;
        self.layernorm_backward(self.buf(&b.x_final), &b.lnf_stats, "ln_f", false, Some(last_mlp))?;
        written(0)?;
        for l in (0..c.layers).rev() {
            let a = &b.blocks[l];
            let p = format!("blocks.{l}");
            let site = attention_site(l);
            let d_u = [self.buf(&b.d_u), self.buf(&b.d_u_bf16)];
            let d_u_out = if bf16 { [NULL, d_u[1]] } else { [d_u[0], NULL] };
            let mlp_proj = format!("{p}.mlp.proj");
            self.linear_backward(
                branch(site + 2)?,
                e,
                self.operand(&a.gelu),
                &mlp_proj,
                e,
                f,
                d_u_out,
                self.buf(&a.u),
            )?;
            self.linear_backward(d_u, f, self.operand(&a.ln2), &format!("{p}.mlp.fc"), f, e, d_ln, NULL)?;
            self.layernorm_backward(self.buf(&a.x_attn), &a.ln2_stats, &format!("{p}.ln2"), true, Some(site + 1))?;
            let d_y = [self.buf(&b.d_y), NULL];
            self.linear_backward(branch(site + 1)?, e, self.operand(&a.y), &format!("{p}.attn.proj"), e, e, d_y, NULL)?;
            if let Some(flash) = self.flash_attention() {
                let tensors = [
                    self.buf(&a.qkv),
                    self.buf(&a.y.fp32),
                    self.buf(&b.d_y),
                    self.buf(&a.lse),
                    NULL,
                    self.buf(&b.d_qkv_bf16),
                ];
                flash.backward(&self.gpu, tensors, b.batch, c.heads, c.block, self.dropout_site(site, true))?;
            } else {
                self.launch_site(
                    &self.kernels.attention_backward,
                    b.batch * c.heads * Self::key_chunks(c),
                    self.attention_backward_shared,
                    self.dropout_site(site, true),
                    &[
                        self.buf(&a.qkv),
                        self.buf(&a.y.fp32),
                        self.buf(&b.d_y),
                        self.buf(&a.lse),
                        self.buf(&b.d_qkv),
                        Arg::i32(c.heads as i32),
                        Arg::i32(n as i32),
                        self.buf(&b.dq_part),
                        self.buf(&b.attention_tickets),
                    ],
                )?;
            }
            let d_qkv = [self.buf(&b.d_qkv), self.buf(&b.d_qkv_bf16)];
            self.linear_backward(d_qkv, 3 * e, self.operand(&a.ln1), &format!("{p}.attn.qkv"), 3 * e, e, d_ln, NULL)?;
            let previous_mlp = (l > 0).then(|| attention_site(l - 1) + 2);
            self.layernorm_backward(self.buf(&a.x), &a.ln1_stats, &format!("{p}.ln1"), true, previous_mlp)?;
            written(c.layers - l)?;
        }
        let slices = n.div_ceil(EMBEDDING_SLICE_ROWS);
        let args = [
            self.buf(&b.d_res),
            self.buf(&self.train),
            offsets,
            Arg::i32(n as i32),
            Arg::i32(c.vocab as i32),
            self.grad_of("tok_emb.weight"),
            self.grad_of("pos_emb.weight"),
            if c.tie_weights { self.buf(&self.head_grad) } else { Arg::Ptr(0) },
            self.buf(&b.embedding_partials),
            self.buf(&b.embedding_tickets),
        ];
        let grid = ((c.vocab + c.block) as u32, slices as u32);
        let dropout = StructArg::of(&self.dropout_site(EMBEDDING_SITE, true));
        self.gpu.launch_with_struct(&self.kernels.embedding_backward, (grid, 0, false), &dropout, &args)?;
        written(c.layers + 1)
    }
}
