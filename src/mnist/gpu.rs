//! The MNIST classifier on a CUDA GPU (placeholder: the kernels in fused/mnist.cu are being written).

use crate::device::Gpu;
use crate::selftest::Check;
use anyhow::{Result, bail};
use std::sync::Arc;

/// Each MNIST kernel and whole training steps against the CPU reference (see `textnet selftest`).
pub fn selftest_checks(_gpu: &Arc<Gpu>, _seed: u64) -> Result<Vec<Check>> {
    Ok(Vec::new())
}

/// `textnet bench mnist`.
pub fn bench(_gpu: &Arc<Gpu>, _args: &crate::bench::BenchArgs) -> Result<()> {
    bail!("bench mnist: the MNIST GPU pipeline is not built yet")
}
