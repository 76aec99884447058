//! `textnet bench matmul`: one fp32 product C = A·B (row-major A M×K, B K×N, C M×N) by a naive kernel, the
//! tiled kernels of fused/gemm.cuh that the pipelines' dense layers run (gemm_128 and a 64×64 gemm_tile,
//! wrapped in fused/matmul.cu), and cuBLAS, each checked against the CPU reference `reference`; and the
//! bf16 tensor-core products (gemm_tile_bf16, gemm_tile_bf16_async, and on Hopper gemm_tile_bf16_wgmma and
//! gemm_bf16_tma) beside cuBLAS bf16, checked against `reference` on the bf16-rounded operands. The launch
//! layer is `gpu`, the bench `bench`, the selftest checks `checks`.

pub mod bench;
pub mod checks;
pub mod gpu;

use anyhow::{Result, bail};
use rayon::prelude::*;

/// C = A·B with every sum accumulated in f64 (rows of C in parallel): A is M×K, B K×N, row-major.
pub fn reference(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Result<Vec<f32>> {
    if a.len() != m * k || b.len() != k * n {
        bail!("operands of {} and {} floats are not {m}×{k} and {k}×{n}", a.len(), b.len());
    }
    let mut c = vec![0f32; m * n];
    if n == 0 {
        return Ok(c);
    }
    c.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        let mut acc = vec![0f64; n];
        for (p, &x) in a[i * k..(i + 1) * k].iter().enumerate() {
            for (s, &y) in acc.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *s += x as f64 * y as f64;
            }
        }
        row.iter_mut().zip(&acc).for_each(|(r, &s)| *r = s as f32);
    });
    Ok(c)
}

/// `bench matmul` and its selftest checks (no command or model file of its own).
pub const PIPELINE: crate::pipeline::Pipeline = crate::pipeline::Pipeline {
    name: "matmul",
    commands: &[],
    checks: checks::selftest_checks,
    modules: checks::modules,
    benches: &[crate::pipeline::Bench {
        name: "matmul",
        about: "matrix products: 1024³ fp32 (naive, tiled, cuBLAS), bf16 tensor cores (gemm_tile_bf16, gemm_tile_bf16_async, wgmma and TMA on Hopper, cuBLAS) at 1024³, 4096³ and the Transformer's shapes",
        args: |command| command,
        run: |gpu, options, _| bench::bench(gpu, options.repeats, options.json),
    }],
    models: &[],
    language_model: None,
    image_classifier: None,
    onnx: None,
};
