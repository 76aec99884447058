//! The chunked step (fused/text.cu) for a few samples, or any batch when the tiled kernels do not fit:
//! text_hidden, text_forward, text_backward and text_update per chunk of TEXT_SB samples, and
//! text_advance moving the sample cursor.

use super::GpuTrainer;
use crate::device::launch::Arg;
use anyhow::Result;

impl GpuTrainer {
    /// x and z1 of `batch` samples starting `offset` past the cursor, where no text_update formed them.
    pub fn launch_hidden(&mut self, batch: usize, offset: usize) -> Result<()> {
        self.ensure_capacity(batch)?;
        let chunk = self.layout.chunk(batch);
        let func = self.kernels_for(batch)?.hidden.clone();
        let (g, table) = (&*self.gpu, &self.buffer_table);
        let args = [Arg::u32(offset as u32), Arg::i32(self.shape.context as i32), Arg::i32(batch as i32)];
        let blocks = batch.div_ceil(chunk) as u32;
        g.launch_with_struct(&func, ((blocks, 1), self.layout.hidden_shared(chunk) as u32, false), table, &args)
    }

    /// Kernel 1 for `batch` samples, whose z1 is in place (text_hidden or the previous step's text_update).
    /// `programmatic`: may overlap the kernel before it (only when that is a step kernel, never text_advance
    /// or a copy).
    pub fn launch_forward(&mut self, batch: usize, programmatic: bool) -> Result<()> {
        self.ensure_capacity(batch)?;
        self.settle_w2()?;
        let chunk = self.layout.chunk(batch);
        let func = self.kernels_for(batch)?.forward.clone();
        let (g, l, table) = (&*self.gpu, &self.layout, &self.buffer_table);
        let args = [
            Arg::i32(self.shape.vocab as i32),
            Arg::i32(batch as i32),
            Arg::i32(l.rows_per_block as i32),
            Arg::i32(l.tile_rows as i32),
        ];
        g.launch_with_struct(&func, ((l.grid as u32, 1), l.forward_shared(chunk) as u32, programmatic), table, &args)
    }

    /// Kernel 2: softmax normalisation, W2/b2 update, dh partials, loss.
    pub fn launch_backward(&mut self, batch: usize, offset: usize, lr: f32, programmatic: bool) -> Result<()> {
        self.settle_w2()?;
        let chunk = self.layout.chunk(batch);
        let func = self.kernels_for(batch)?.backward.clone();
        let (g, l, table) = (&*self.gpu, &self.layout, &self.buffer_table);
        let args = [
            Arg::u32(offset as u32),
            Arg::i32(self.shape.vocab as i32),
            Arg::i32(batch as i32),
            Arg::i32(l.rows_per_block as i32),
            Arg::i32(l.tile_rows as i32),
            Arg::f32(lr),
        ];
        let shared = l.backward_shared(chunk, batch > chunk);
        g.launch_with_struct(&func, ((l.grid as u32, 1), shared as u32, programmatic), table, &args)
    }

    /// Kernel 3: W1/b1 update and the embedding rows of the context tokens; then x and z1 of the next
    /// `batch` samples.
    pub fn launch_update(&mut self, batch: usize, offset: usize, lr: f32, programmatic: bool) -> Result<()> {
        let chunk = self.layout.chunk(batch);
        let func = self.kernels_for(batch)?.update.clone();
        let (g, l, table) = (&*self.gpu, &self.layout, &self.buffer_table);
        let args = [
            Arg::u32(self.positions.len() as u32),
            Arg::u32(offset as u32),
            Arg::i32(self.shape.context as i32),
            Arg::i32(batch as i32),
            Arg::f32(lr),
            Arg::i32(l.update_whole_dx(chunk) as i32),
        ];
        let shared = l.update_shared(chunk, l.update_whole_dx(chunk)) as u32;
        g.launch_with_struct(&func, ((l.update_grid as u32, 1), shared, programmatic), table, &args)
    }

    /// Moves the device cursor `samples` samples on.
    pub fn launch_advance(&mut self, samples: usize) -> Result<()> {
        let func = self.kernels_for(1)?.advance.clone();
        let args = [Arg::buf(&self.gpu, &self.cursor), Arg::u32(samples as u32)];
        self.gpu.launch(&func, (1, 1), 0, false, &args)
    }
}
