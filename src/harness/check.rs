//! The harness every pipeline's selftest checks are built on: one check's result, the relative error it
//! is judged by, which checks a run selects, and the random generator each group of checks draws from.

use crate::device::{self, Gpu};
use crate::ops::cpu::SeededRng;
use rand::SeedableRng;
use std::sync::Arc;

/// One comparison of a GPU result with the CPU reference.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Check {
    /// The kernel or run compared, e.g. "matmul_tile128".
    pub kernel: String,
    /// The shape it was compared at, in words.
    pub shape: String,
    /// Relative error of the GPU result against the CPU reference (`rel_error`).
    pub rel_error: f64,
    /// The largest relative error that passes.
    pub tolerance: f64,
}

impl Check {
    /// A check of what holds or not, to the bit (a capture against op by op, a fusion made): error 0 when
    /// `holds`, else infinite, against a tolerance of 0.
    pub fn holds(kernel: impl Into<String>, shape: impl Into<String>, holds: bool) -> Check {
        Check {
            kernel: kernel.into(),
            shape: shape.into(),
            rel_error: if holds { 0.0 } else { f64::INFINITY },
            tolerance: 0.0,
        }
    }

    /// Whether the error is finite and within the tolerance.
    pub fn passed(&self) -> bool {
        self.rel_error.is_finite() && self.rel_error <= self.tolerance
    }
}

/// ‖a − b‖ / ‖b‖ in f64; NaN anywhere (a poisoned value nobody wrote) gives infinity.
pub fn rel_error(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let (mut diff, mut norm) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        if !x.is_finite() || !y.is_finite() {
            return f64::INFINITY;
        }
        diff += (x as f64 - y as f64).powi(2);
        norm += (y as f64).powi(2);
    }
    if norm == 0.0 { if diff == 0.0 { 0.0 } else { f64::INFINITY } } else { (diff / norm).sqrt() }
}

/// The largest of named relative errors and its name; anything not finite (NaN included) counts as
/// infinite, so a poisoned value is never hidden by a smaller error beside it.
pub fn worst<N: Default>(errors: impl IntoIterator<Item = (N, f64)>) -> (f64, N) {
    let finite = |e: f64| if e.is_finite() { e } else { f64::INFINITY };
    errors.into_iter().fold((0.0, N::default()), |w, (name, e)| if finite(e) > w.0 { (finite(e), name) } else { w })
}

/// How close a ReLU unit's pre-activation z = w·x + b comes to the kink at 0, relative to the terms summed
/// into it: |z| / (|b| + Σ_k |`w[k]`·`x[k]`|). Any summation order rounds z by a few ulps of that denominator
/// (relative 1e-7), so a unit whose ratio is far above that takes the same side of the kink on the GPU as
/// on the CPU; one within rounding of it may take ReLU′ = 1 in one order and 0 in another.
pub fn kink_ratio(w: &[f32], b: f32, x: &[f32]) -> f64 {
    let (mut z, mut scale) = (b as f64, (b as f64).abs());
    for (&wk, &xk) in w.iter().zip(x) {
        let term = wk as f64 * xk as f64;
        z += term;
        scale += term.abs();
    }
    if scale == 0.0 { f64::INFINITY } else { z.abs() / scale }
}

/// The kinds of check every pipeline has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Group {
    /// Each kernel alone on fresh random inputs
    Kernels,
    /// Whole training runs through the production path against the CPU reference
    Training,
    /// A training run twice: the same bits
    Repeat,
}

/// The selftest checks of a shared layer (`nn`), selectable by name as a pipeline's are.
#[derive(Debug)]
pub struct Suite {
    /// The name `selftest --only` knows it by.
    pub name: &'static str,
    /// The GPU-against-CPU checks.
    pub checks: fn(&Arc<Gpu>, &Plan) -> anyhow::Result<Vec<Check>>,
    /// The kernel modules those checks compile.
    pub modules: fn(&Plan) -> Vec<device::compile::ModuleRequest>,
}

/// What a selftest run asks of each pipeline.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Seed of the random inputs.
    pub seed: u64,
    /// Skip the largest shapes.
    pub quick: bool,
    /// The groups to run; empty: all.
    pub groups: Vec<Group>,
}

impl Plan {
    /// Whether this run includes the checks of `group` (every group when none was named).
    pub fn wants(&self, group: Group) -> bool {
        self.groups.is_empty() || self.groups.contains(&group)
    }

    /// The generator of one named part of the checks. Each part draws from its own stream, so a seed gives
    /// the same problems whichever other parts run (`--only training --seed S` repeats the full run's).
    pub fn rng(&self, part: &str) -> SeededRng {
        // FNV-1a of the name, mixed into the seed.
        let tag = part.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
        SeededRng::seed_from_u64(self.seed ^ tag)
    }
}

/// Opens the GPU for the ignored tests, failing loudly (never skipping) when there is none.
pub fn test_gpu() -> Arc<Gpu> {
    match device::select(device::DeviceChoice::Cuda) {
        Ok(device::Backend::Cuda(gpu)) => gpu,
        Ok(device::Backend::Cpu) => unreachable!("--device cuda never falls back"),
        Err(e) => panic!("this test needs a CUDA GPU: {e:#}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_error_is_found_and_nan_is_worst() {
        assert_eq!(worst([("a", 1e-6), ("b", 3e-5), ("c", 2e-5)]), (3e-5, "b"));
        assert_eq!(worst([("a", 1e-6), ("b", f64::NAN), ("c", 2e-5)]), (f64::INFINITY, "b"));
        assert_eq!(worst(Vec::<(&str, f64)>::new()), (0.0, ""));
    }
}
