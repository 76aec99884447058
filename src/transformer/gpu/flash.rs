//! The launch layer of fused/flash_attention.cuh, the Transformer's causal attention in bf16 on the tensor
//! cores (`tf_flash_attention_forward` and `tf_flash_attention_backward` of fused/transformer.cu): their
//! grids and shared memory from `FlashSizes`, a launcher per pass, and `bench_attention`, which times them
//! beside the fp32 attention kernels at nanoGPT's shape.

use super::module_request;
use crate::device::kernel_struct::{Address, DropoutArgs};
use crate::device::{Gpu, launch::Arg, launch::Kernel, launch::StructArg};
use crate::ops::attention::AttentionSizes;
pub use crate::ops::attention::FlashSizes;
use crate::transformer::model::Config;
use anyhow::{Context, Result, bail};
use cudarc::driver::{CudaModule, CudaSlice};
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use std::sync::Arc;

/// The two bf16 attention kernels of a loaded transformer module.
pub struct FlashAttention {
    forward: Kernel,
    backward: Kernel,
    sizes: FlashSizes,
}

impl FlashAttention {
    /// Loads both kernels from `module` (compiled for `sizes`) and opts in to their shared memory.
    pub fn new(gpu: &Gpu, module: &Arc<CudaModule>, sizes: FlashSizes) -> Result<FlashAttention> {
        if sizes.hs == 0 || !sizes.hs.is_multiple_of(16) {
            bail!("bf16 attention needs a head size (--embed / --heads) that is a multiple of 16, got {}", sizes.hs);
        }
        let forward = Gpu::function(module, "tf_flash_attention_forward")?;
        let backward = Gpu::function(module, "tf_flash_attention_backward")?;
        gpu.reserve_shared(&forward, sizes.forward_bytes(), "the head size (--embed / --heads)")?;
        gpu.reserve_shared(&backward, sizes.backward_bytes(), "the head size (--embed / --heads)")?;
        Ok(FlashAttention { forward, backward, sizes })
    }

    /// y `[B·T][C]` (`[y, y_bf16]`: in fp32, bf16 or both, a null pointer skipping one) and lse
    /// `[B·heads][T]` of `batch` sequences of `len` ≤ T positions (sequence b at rows b·T …) from qkv
    /// `[B·T][3C]`, with `dropout` on the probabilities. Grid (B·heads, BLOCKS), FORWARD_BYTES.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        gpu: &Gpu,
        qkv: Arg,
        [y, y_bf16]: [Arg; 2],
        lse: Arg,
        batch: usize,
        heads: usize,
        len: usize,
        dropout: DropoutArgs,
    ) -> Result<()> {
        let grid = ((batch * heads) as u32, self.sizes.blocks() as u32);
        let args = [qkv, y, y_bf16, lse, Arg::i32(heads as i32), Arg::i32(len as i32)];
        let shape = (grid, self.sizes.forward_bytes() as u32, false);
        gpu.launch_with_struct(&self.forward, shape, &StructArg::of(&dropout), &args)
    }

    /// dq, dk, dv into dqkv `[B·T][3C]` (and into dqkv_bf16 in bf16; a null pointer skips either) from dy
    /// `[B·T][C]` and the forward pass's y and lse, with the forward pass's dropout. Grid (B·heads, 2·BLOCKS), BACKWARD_BYTES.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        gpu: &Gpu,
        [qkv, y, dy, lse, dqkv, dqkv_bf16]: [Arg; 6],
        batch: usize,
        heads: usize,
        len: usize,
        dropout: DropoutArgs,
    ) -> Result<()> {
        let grid = ((batch * heads) as u32, 2 * self.sizes.blocks() as u32);
        let args = [qkv, y, dy, lse, dqkv, dqkv_bf16, Arg::i32(heads as i32), Arg::i32(len as i32)];
        let shape = (grid, self.sizes.backward_bytes() as u32, false);
        gpu.launch_with_struct(&self.backward, shape, &StructArg::of(&dropout), &args)
    }
}

/// nanoGPT's attention: batch 64, 6 heads of 64, block 256.
const BENCH_SHAPE: Config =
    Config { vocab: 65, block: 256, embed: 384, heads: 6, layers: 1, bias: true, tie_weights: false };
const BENCH_BATCH: usize = 64;
const BENCH_LAUNCHES: usize = 20;

/// Times the attention kernels alone at nanoGPT's shape, fp32 (fused/attention.cuh) beside bf16 (flash),
/// forward and backward, each the median of 5 runs of BENCH_LAUNCHES launches between device events, and
/// prints milliseconds per launch and TFLOP/s. FLOPs: the causal pairs (t, u ≤ t) times 4·HS forward (q·k
/// and p·v) and 2.5 times that backward (the usual count of five products; the bf16 kernel computes seven).
pub fn bench_attention(gpu: &Arc<Gpu>) -> Result<()> {
    let c = BENCH_SHAPE;
    let (b, t, heads, hs, e) = (BENCH_BATCH, c.block, c.heads, c.head_size(), c.embed);
    let n = b * t;
    let module = gpu.module(&module_request(&c))?;
    let stream = &gpu.stream;
    let mut rng = crate::ops::cpu::SeededRng::seed_from_u64(1);
    let normal = Normal::new(0.0f32, 1.0).expect("a valid normal");
    let mut random = |len: usize| -> Vec<f32> { (0..len).map(|_| normal.sample(&mut rng)).collect() };
    let qkv = stream.clone_htod(&random(n * 3 * e))?;
    let dy = stream.clone_htod(&random(n * e))?;
    let z = |len: usize| -> Result<CudaSlice<f32>> { Ok(stream.alloc_zeros::<f32>(len)?) };
    let (y, lse, dqkv) = (z(n * e)?, z(b * heads * t)?, z(n * 3 * e)?);
    let buf = |s: &CudaSlice<f32>| Arg::buf(gpu, s);

    let fp32 = AttentionSizes { t, hs, warps: crate::ops::THREADS_PER_BLOCK as usize / 32 };
    let chunks = t.div_ceil(fp32.key_chunk());
    let dq_part = z(chunks * n * e)?;
    let tickets: CudaSlice<u32> = stream.alloc_zeros(b * heads)?;
    let f32_forward = Gpu::function(&module, "tf_attention_forward")?;
    let f32_backward = Gpu::function(&module, "tf_attention_backward")?;
    gpu.reserve_shared(&f32_forward, 4 * fp32.forward_floats(), "--block")?;
    gpu.reserve_shared(&f32_backward, 4 * fp32.backward_floats(), "--block")?;
    let flash = FlashAttention::new(gpu, &module, FlashSizes { t, hs })?;
    let step: CudaSlice<u32> = stream.alloc_zeros(1)?;
    let dropout = DropoutArgs::site(Address::of(gpu, &step), 7, 0.1);

    let time = |launch: &dyn Fn() -> Result<()>| -> Result<f64> {
        launch()?;
        let runs: Vec<f64> = (0..5)
            .map(|_| {
                crate::harness::timing::time_on_device(gpu, || (0..BENCH_LAUNCHES).try_for_each(|_| launch()))
                    .map(|ms| ms / BENCH_LAUNCHES as f64)
            })
            .collect::<Result<_>>()?;
        Ok(crate::harness::timing::median(&runs))
    };
    let off = StructArg::of(&DropoutArgs::off());
    let fp32_forward = time(&|| {
        let args = [buf(&qkv), buf(&y), buf(&lse), Arg::i32(heads as i32)];
        let shape = (((b * heads) as u32, 1), 4 * fp32.forward_floats() as u32, false);
        gpu.launch_with_struct(&f32_forward, shape, &off, &args)
    })?;
    let fp32_backward = time(&|| {
        let args = [
            buf(&qkv),
            buf(&y),
            buf(&dy),
            buf(&lse),
            buf(&dqkv),
            Arg::i32(heads as i32),
            Arg::i32(n as i32),
            buf(&dq_part),
            Arg::buf(gpu, &tickets),
        ];
        let shape = (((b * heads * chunks) as u32, 1), 4 * fp32.backward_floats() as u32, false);
        gpu.launch_with_struct(&f32_backward, shape, &off, &args)
    })?;
    let mut bf16 = Vec::new();
    for drop in [DropoutArgs::off(), dropout] {
        let none = Arg::Ptr(0);
        let forward = time(&|| flash.forward(gpu, buf(&qkv), [buf(&y), none], buf(&lse), b, heads, t, drop))?;
        let tensors = [buf(&qkv), buf(&y), buf(&dy), buf(&lse), buf(&dqkv), none];
        let backward = time(&|| flash.backward(gpu, tensors, b, heads, t, drop))?;
        bf16.push((forward, backward));
    }
    stream.synchronize().context("an attention kernel failed")?;

    let pairs = (b * heads * t * (t + 1) / 2) as f64;
    let forward_flops = 4.0 * hs as f64 * pairs;
    let tflops = |flops: f64, ms: f64| flops / (ms * 1e-3) / 1e12;
    println!("attention alone on {}: batch {b}, {heads} heads of {hs}, T {t}, causal", gpu.describe());
    let line = |name: &str, (forward, backward): (f64, f64)| {
        println!(
            "  {name:<22} forward {forward:.4} ms ({:.1} TFLOP/s)  backward {backward:.4} ms ({:.1} TFLOP/s)  \
             both {:.4} ms",
            tflops(forward_flops, forward),
            tflops(2.5 * forward_flops, backward),
            forward + backward
        );
    };
    line("fp32 (attention.cuh)", (fp32_forward, fp32_backward));
    line("bf16 flash", bf16[0]);
    line("bf16 flash, dropout 0.1", bf16[1]);
    let gflops = forward_flops / 1e9;
    println!("  FLOPs: forward {gflops:.3} G (4·HS per causal pair), backward 2.5× that");
    println!("  each the median of 5 runs of {BENCH_LAUNCHES} launches between device events");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::FlashSizes;
    use crate::device::compile::kernel_constants;

    #[test]
    fn sizes_match_the_kernel_file() {
        for (t, hs) in [(64, 16), (256, 64), (200, 64), (1024, 32), (5, 48)] {
            let sizes = FlashSizes { t, hs };
            let s = format!("FlashSizes<{t}, {hs}>");
            let kernel = kernel_constants(
                "transformer",
                &[],
                &[
                    &format!("{s}::ROWS"),
                    &format!("{s}::TILE"),
                    &format!("{s}::BLOCKS"),
                    &format!("{s}::FORWARD_BYTES"),
                    &format!("{s}::BACKWARD_BYTES"),
                ],
            )
            .unwrap();
            let mirror =
                [FlashSizes::ROWS, FlashSizes::TILE, sizes.blocks(), sizes.forward_bytes(), sizes.backward_bytes()];
            assert_eq!(kernel, mirror.map(|v| v as i64), "T = {t}, HS = {hs}");
        }
    }
}
