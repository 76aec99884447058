//! The matmul selftest checks: matmul_naive, matmul_tile128, matmul_tile64 and matmul_tile128_split2 against the CPU reference
//! (relative 1e-5) on fresh uniform inputs in [−1, 1), over shapes that hit every edge of the tiles: one
//! element, partial tiles in every dimension, exactly one 128² tile, and several partial ones. Each
//! output is poisoned with NaN first, so an element no thread writes fails the check.

use super::gpu::{GpuMatmul, Kernel};
use crate::check::{Check, Group, Plan, rel_error};
use crate::cpu::SeededRng;
use crate::device::{Gpu, ModuleRequest};
use anyhow::{Context, Result};
use rand::RngExt;
use std::sync::Arc;

/// Largest relative error a kernel's product may have against the CPU reference.
pub const TOLERANCE: f64 = 1e-5;

/// (M, N, K).
const SHAPES: [(usize, usize, usize); 4] = [(1, 1, 1), (33, 65, 17), (128, 128, 128), (257, 129, 300)];

/// `len` uniform values in [−1, 1).
pub fn random_matrix(len: usize, rng: &mut SeededRng) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// The kernel module the checks compile.
pub fn modules(_plan: &Plan) -> Vec<ModuleRequest> {
    vec![super::gpu::MODULE]
}

/// The selftest checks of every matmul kernel against the CPU product.
pub fn selftest_checks(gpu: &Arc<Gpu>, plan: &Plan) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    if !plan.wants(Group::Kernels) {
        return Ok(out);
    }
    let mut rng = plan.rng("matmul kernels");
    let kernels = GpuMatmul::new(gpu.clone())?;
    for (m, n, k) in SHAPES {
        let (a, b) = (random_matrix(m * k, &mut rng), random_matrix(k * n, &mut rng));
        let want = super::reference(&a, &b, m, n, k)?;
        let (a_dev, b_dev) = (gpu.stream.clone_htod(&a)?, gpu.stream.clone_htod(&b)?);
        for kernel in Kernel::ALL {
            let mut c = gpu.stream.clone_htod(&vec![f32::NAN; m * n])?;
            kernels.enqueue(kernel, &a_dev, &b_dev, &mut c, m, n, k)?;
            let got = gpu.stream.clone_dtoh(&c).with_context(|| format!("{} failed", kernel.name()))?;
            out.push(Check {
                kernel: kernel.name().into(),
                shape: format!("{m}×{k} · {k}×{n}"),
                rel_error: rel_error(&got, &want),
                tolerance: TOLERANCE,
            });
        }
    }
    Ok(out)
}
