//! One training step's kernels in stream order: the forward pass (embedding, blocks of LayerNorm,
//! attention and MLP with their residual adds, the classifier and its loss), the backward pass in
//! reverse, and the AdamW update, each a launch of fused/transformer.cu.

use super::{
    EMBEDDING_SLICE_ROWS, GpuTransformer, LN_ROWS_PER_BLOCK, LinearTiles, THREADS, TICKET_ADAMW, TICKET_CLASSIFIER,
    TICKET_LAYERNORM, TICKET_NORM, WARPS,
};
use crate::device::Arg;
use crate::precision::Precision;
use crate::transformer::model::{EMBEDDING_SITE, attention_site};
use anyhow::Result;
use cudarc::driver::CudaSlice;

impl GpuTransformer {
    pub(super) fn linear_forward(
        &self,
        input: Arg,
        layer: &str,
        out: Arg,
        pre: Arg,
        out_features: usize,
        in_features: usize,
    ) -> Result<()> {
        let n = self.rows();
        let mut args = vec![
            input,
            self.param(&format!("{layer}.weight")),
            self.param(&format!("{layer}.bias")),
            out,
            pre,
            Arg::i32(n as i32),
            Arg::i32(out_features as i32),
            Arg::i32(in_features as i32),
        ];
        let tiles = LinearTiles::of(self.precision);
        let kernel = match self.precision {
            Precision::Bf16 => &self.kernels.linear_forward_bf16,
            p => {
                args.push(Arg::i32((p == Precision::Tf32) as i32));
                &self.kernels.linear_forward
            }
        };
        let grid = (out_features.div_ceil(tiles.bn) as u32, n.div_ceil(tiles.bm) as u32);
        self.gpu.launch(kernel, grid, tiles.shared_bytes as u32, false, &args)
    }

    /// dW, db of `layer` from dy and its input x; dx = dy·W (× GELU′(pre)) unless dx is null.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn linear_backward(
        &self,
        dy: Arg,
        x: Arg,
        layer: &str,
        out_features: usize,
        in_features: usize,
        dx: Arg,
        pre: Arg,
    ) -> Result<()> {
        let n = self.rows();
        let t = LinearTiles::of(self.precision);
        let tiles = t.wgrad_tiles(out_features, in_features);
        let slices = Self::slices(&self.gpu, tiles, n);
        let dx_blocks = if matches!(dx, Arg::Ptr(0)) { 0 } else { in_features.div_ceil(t.bn) * n.div_ceil(t.bm) };
        let b = &self.buffers;
        let mut args = vec![
            dy,
            x,
            self.param(&format!("{layer}.weight")),
            Arg::i32(n as i32),
            Arg::i32(out_features as i32),
            Arg::i32(in_features as i32),
            Arg::i32(slices as i32),
            self.grad_of(&format!("{layer}.weight")),
            self.grad_of(&format!("{layer}.bias")),
            self.buf(&b.linear_partials),
            self.buf(&b.linear_tickets),
            dx,
            pre,
        ];
        let kernel = match self.precision {
            Precision::Bf16 => &self.kernels.linear_backward_bf16,
            p => {
                args.push(Arg::i32((p == Precision::Tf32) as i32));
                &self.kernels.linear_backward
            }
        };
        self.launch(kernel, tiles * slices + dx_blocks, t.shared_bytes, &args)
    }

    pub(super) fn layernorm_backward(&self, x: Arg, stats: &CudaSlice<f32>, ln: &str, accumulate: bool) -> Result<()> {
        let n = self.rows();
        let b = &self.buffers;
        let stats_ptr = self.ptr(stats);
        let args = [
            x,
            Arg::Ptr(stats_ptr),
            Arg::Ptr(stats_ptr + 4 * n as u64),
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
        self.launch(&self.kernels.layernorm_backward, n.div_ceil(LN_ROWS_PER_BLOCK), 0, &args)
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
        let stats = |s: &CudaSlice<f32>| -> (Arg, Arg) {
            let p = self.ptr(s);
            (Arg::Ptr(p), Arg::Ptr(p + 4 * n as u64))
        };
        let (m0, r0) = stats(&b.blocks[0].ln1_stats);
        let with = |args: &[Arg], site: usize| -> Vec<Arg> { [args, &self.site_args(site, training)].concat() };
        self.launch(
            &self.kernels.embed_layernorm,
            row_blocks,
            0,
            &with(
                &[
                    data,
                    offsets,
                    Arg::i32(n as i32),
                    self.param("tok_emb.weight"),
                    self.param("pos_emb.weight"),
                    self.buf(&b.blocks[0].x),
                    self.param("blocks.0.ln1.weight"),
                    self.param("blocks.0.ln1.bias"),
                    self.buf(&b.blocks[0].ln1),
                    m0,
                    r0,
                ],
                EMBEDDING_SITE,
            ),
        )?;
        let null = Arg::Ptr(0);
        for l in 0..c.layers {
            let a = &b.blocks[l];
            let p = format!("blocks.{l}");
            let site = attention_site(l);
            self.linear_forward(self.buf(&a.ln1), &format!("{p}.attn.qkv"), self.buf(&a.qkv), null, 3 * e, e)?;
            if let Some(flash) = self.flash_attention() {
                let dropout = self.site_args(site, training);
                flash.forward(
                    &self.gpu,
                    self.buf(&a.qkv),
                    self.buf(&a.y),
                    self.buf(&a.lse),
                    b.batch,
                    c.heads,
                    c.block,
                    dropout,
                )?;
            } else {
                self.launch(
                    &self.kernels.attention_forward,
                    b.batch * c.heads,
                    self.attention_forward_shared,
                    &with(&[self.buf(&a.qkv), self.buf(&a.y), self.buf(&a.lse), Arg::i32(c.heads as i32)], site),
                )?;
            }
            self.linear_forward(self.buf(&a.y), &format!("{p}.attn.proj"), self.buf(&a.attn_out), null, e, e)?;
            let (m2, r2) = stats(&a.ln2_stats);
            self.launch(
                &self.kernels.residual_layernorm,
                row_blocks,
                0,
                &with(
                    &[
                        self.buf(&a.x),
                        self.buf(&a.attn_out),
                        self.buf(&a.x_attn),
                        Arg::i32(n as i32),
                        self.param(&format!("{p}.ln2.weight")),
                        self.param(&format!("{p}.ln2.bias")),
                        self.buf(&a.ln2),
                        m2,
                        r2,
                    ],
                    site + 1,
                ),
            )?;
            self.linear_forward(self.buf(&a.ln2), &format!("{p}.mlp.fc"), self.buf(&a.gelu), self.buf(&a.u), f, e)?;
            self.linear_forward(self.buf(&a.gelu), &format!("{p}.mlp.proj"), self.buf(&a.mlp_out), null, e, f)?;
            let last = l + 1 == c.layers;
            let (next_x, next_ln, next_stats, ln) = if last {
                (&b.x_final, &b.lnf, &b.lnf_stats, "ln_f".to_string())
            } else {
                let nb = &b.blocks[l + 1];
                (&nb.x, &nb.ln1, &nb.ln1_stats, format!("blocks.{}.ln1", l + 1))
            };
            let (mn, rn) = stats(next_stats);
            self.launch(
                &self.kernels.residual_layernorm,
                row_blocks,
                0,
                &with(
                    &[
                        self.buf(&a.x_attn),
                        self.buf(&a.mlp_out),
                        self.buf(next_x),
                        Arg::i32(n as i32),
                        self.param(&format!("{ln}.weight")),
                        self.param(&format!("{ln}.bias")),
                        self.buf(next_ln),
                        mn,
                        rn,
                    ],
                    site + 2,
                ),
            )?;
        }
        self.linear_forward(self.buf(&b.lnf), "head", self.buf(&b.logits), null, c.vocab, e)?;
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
        let args =
            [&[self.buf(&b.d_res), self.buf(&b.d_ln), Arg::i32(n as i32)][..], &self.site_args(site, true)].concat();
        self.launch(&self.kernels.dropout_backward, n.div_ceil(THREADS).min(8 * self.gpu.sm_count as usize), 0, &args)?;
        Ok(self.buf(&b.d_ln))
    }

    /// The backward pass after `enqueue_forward` (training data at `offsets`): every gradient, written.
    pub(super) fn enqueue_backward(&self, offsets: Arg) -> Result<()> {
        let c = &self.config;
        let n = self.rows();
        let (e, f) = (c.embed, c.ffn());
        let b = &self.buffers;
        let null = Arg::Ptr(0);
        self.linear_backward(self.buf(&b.logits), self.buf(&b.lnf), "head", c.vocab, e, self.buf(&b.d_ln), null)?;
        self.layernorm_backward(self.buf(&b.x_final), &b.lnf_stats, "ln_f", false)?;
        for l in (0..c.layers).rev() {
            let a = &b.blocks[l];
            let p = format!("blocks.{l}");
            let site = attention_site(l);
            let d_mlp = self.branch_gradient(site + 2)?;
            self.linear_backward(
                d_mlp,
                self.buf(&a.gelu),
                &format!("{p}.mlp.proj"),
                e,
                f,
                self.buf(&b.d_u),
                self.buf(&a.u),
            )?;
            self.linear_backward(
                self.buf(&b.d_u),
                self.buf(&a.ln2),
                &format!("{p}.mlp.fc"),
                f,
                e,
                self.buf(&b.d_ln),
                null,
            )?;
            self.layernorm_backward(self.buf(&a.x_attn), &a.ln2_stats, &format!("{p}.ln2"), true)?;
            let d_attn = self.branch_gradient(site + 1)?;
            self.linear_backward(d_attn, self.buf(&a.y), &format!("{p}.attn.proj"), e, e, self.buf(&b.d_y), null)?;
            if let Some(flash) = self.flash_attention() {
                let tensors =
                    [self.buf(&a.qkv), self.buf(&a.y), self.buf(&b.d_y), self.buf(&a.lse), self.buf(&b.d_qkv)];
                flash.backward(&self.gpu, tensors, b.batch, c.heads, c.block, self.site_args(site, true))?;
            } else {
                self.launch(
                    &self.kernels.attention_backward,
                    b.batch * c.heads * Self::key_chunks(c),
                    self.attention_backward_shared,
                    &[
                        &[
                            self.buf(&a.qkv),
                            self.buf(&a.y),
                            self.buf(&b.d_y),
                            self.buf(&a.lse),
                            self.buf(&b.d_qkv),
                            Arg::i32(c.heads as i32),
                            Arg::i32(n as i32),
                            self.buf(&b.dq_part),
                            self.buf(&b.attention_tickets),
                        ][..],
                        &self.site_args(site, true),
                    ]
                    .concat(),
                )?;
            }
            self.linear_backward(
                self.buf(&b.d_qkv),
                self.buf(&a.ln1),
                &format!("{p}.attn.qkv"),
                3 * e,
                e,
                self.buf(&b.d_ln),
                null,
            )?;
            self.layernorm_backward(self.buf(&a.x), &a.ln1_stats, &format!("{p}.ln1"), true)?;
        }
        let slices = n.div_ceil(EMBEDDING_SLICE_ROWS);
        let args = [
            &[
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
            ][..],
            &self.site_args(EMBEDDING_SITE, true),
        ]
        .concat();
        let grid = ((c.vocab + c.block) as u32, slices as u32);
        self.gpu.launch(&self.kernels.embedding_backward, grid, 0, false, &args)
    }

    /// The AdamW update at the rate at `rate` (device memory), after clipping's norm when clipping.
    pub(super) fn enqueue_update(&self, rate: Arg) -> Result<()> {
        let o = &self.optim;
        let n = self.layout.len();
        let clipping = o.clip_norm > 0.0;
        if clipping {
            self.launch(
                &self.kernels.grad_norm,
                self.norm_partials.len(),
                0,
                &[
                    self.buf(&self.grad),
                    Arg::i32(n as i32),
                    Arg::f32(o.clip_norm),
                    self.buf(&self.norm_partials),
                    Arg::Ptr(self.ptr(&self.tickets) + 4 * TICKET_NORM as u64),
                    self.buf(&self.grad_scale),
                ],
            )?;
        }
        let blocks = n.div_ceil(THREADS * 4).clamp(1, 4 * self.gpu.sm_count as usize);
        self.launch(
            &self.kernels.adamw,
            blocks,
            0,
            &[
                self.buf(&self.params),
                self.buf(&self.grad),
                self.buf(&self.m),
                self.buf(&self.v),
                Arg::i32(n as i32),
                rate,
                Arg::f32(o.beta1),
                Arg::f32(o.beta2),
                Arg::f32(o.eps),
                Arg::f32(o.weight_decay),
                if clipping { self.buf(&self.grad_scale) } else { Arg::Ptr(0) },
                self.buf(&self.step),
                Arg::Ptr(self.ptr(&self.tickets) + 4 * TICKET_ADAMW as u64),
            ],
        )
    }

    /// One training step on the batch whose offsets are at `offsets` at the learning rate at `rate`, its
    /// loss sum added at `loss_sum`.
    pub(super) fn enqueue_step(&self, offsets: Arg, loss_sum: Arg, rate: Arg) -> Result<()> {
        let scale = 1.0 / self.rows() as f32;
        self.enqueue_forward(self.buf(&self.train), offsets, scale, self.rows(), loss_sum, true)?;
        self.enqueue_backward(offsets)?;
        self.enqueue_update(rate)
    }
}
