//! One training step's kernels in stream order: the forward pass (embedding, blocks of LayerNorm,
//! attention and MLP with their residual adds, the classifier and its loss), the backward pass in
//! reverse, and the AdamW update, each a launch of fused/transformer.cu.

use super::{
    GpuTransformer, LINEAR_SHARED_BYTES, LN_ROWS_PER_BLOCK, THREADS, TICKET_ADAMW, TICKET_CLASSIFIER, TICKET_LAYERNORM,
    WARPS, WG_TILE,
};
use crate::device::Arg;
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
        let args = [
            input,
            self.param(&format!("{layer}.weight")),
            self.param(&format!("{layer}.bias")),
            out,
            pre,
            Arg::i32(n as i32),
            Arg::i32(out_features as i32),
            Arg::i32(in_features as i32),
            Arg::i32(self.tf32 as i32),
        ];
        let grid = (out_features.div_ceil(64) as u32, n.div_ceil(32) as u32);
        self.gpu.launch(&self.kernels.linear_forward, grid, LINEAR_SHARED_BYTES as u32, false, &args)
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
        let tiles = out_features.div_ceil(WG_TILE) * (in_features + 1).div_ceil(WG_TILE);
        let slices = Self::slices(&self.gpu, tiles, n);
        let dx_blocks = if matches!(dx, Arg::Ptr(0)) { 0 } else { in_features.div_ceil(64) * n.div_ceil(32) };
        let b = &self.buffers;
        let args = [
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
            Arg::i32(self.tf32 as i32),
        ];
        self.launch(&self.kernels.linear_backward, tiles * slices + dx_blocks, LINEAR_SHARED_BYTES, &args)
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
    /// rows added to `loss_sum`.
    pub(super) fn enqueue_forward(
        &self,
        data: Arg,
        offsets: Arg,
        scale: f32,
        counted: usize,
        loss_sum: Arg,
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
        self.launch(
            &self.kernels.embed_layernorm,
            row_blocks,
            0,
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
        )?;
        let null = Arg::Ptr(0);
        for l in 0..c.layers {
            let a = &b.blocks[l];
            let p = format!("blocks.{l}");
            self.linear_forward(self.buf(&a.ln1), &format!("{p}.attn.qkv"), self.buf(&a.qkv), null, 3 * e, e)?;
            self.launch(
                &self.kernels.attention_forward,
                b.batch * c.heads,
                self.attention_forward_shared,
                &[self.buf(&a.qkv), self.buf(&a.y), self.buf(&a.lse), Arg::i32(c.heads as i32)],
            )?;
            self.linear_forward(self.buf(&a.y), &format!("{p}.attn.proj"), self.buf(&a.attn_out), null, e, e)?;
            let (m2, r2) = stats(&a.ln2_stats);
            self.launch(
                &self.kernels.residual_layernorm,
                row_blocks,
                0,
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
            self.linear_backward(
                self.buf(&b.d_res),
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
            self.linear_backward(
                self.buf(&b.d_res),
                self.buf(&a.y),
                &format!("{p}.attn.proj"),
                e,
                e,
                self.buf(&b.d_y),
                null,
            )?;
            self.launch(
                &self.kernels.attention_backward,
                b.batch * c.heads * Self::key_chunks(c),
                self.attention_backward_shared,
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
                ],
            )?;
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
        self.launch(
            &self.kernels.embedding_backward,
            c.vocab + c.block,
            4 * n,
            &[
                self.buf(&b.d_res),
                self.buf(&self.train),
                offsets,
                Arg::i32(n as i32),
                Arg::i32(c.vocab as i32),
                self.grad_of("tok_emb.weight"),
                self.grad_of("pos_emb.weight"),
            ],
        )
    }

    pub(super) fn enqueue_update(&self) -> Result<()> {
        let o = &self.optim;
        let n = self.layout.len();
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
                Arg::f32(o.lr),
                Arg::f32(o.beta1),
                Arg::f32(o.beta2),
                Arg::f32(o.eps),
                Arg::f32(o.weight_decay),
                self.buf(&self.step),
                Arg::Ptr(self.ptr(&self.tickets) + 4 * TICKET_ADAMW as u64),
            ],
        )
    }

    /// One training step on the batch whose offsets are at `offsets`, its loss sum added at `loss_sum`.
    pub(super) fn enqueue_step(&self, offsets: Arg, loss_sum: Arg) -> Result<()> {
        let scale = 1.0 / self.rows() as f32;
        self.enqueue_forward(self.buf(&self.train), offsets, scale, self.rows(), loss_sum)?;
        self.enqueue_backward(offsets)?;
        self.enqueue_update()
    }
}
