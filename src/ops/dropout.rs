//! The CPU twin of fused/dropout.cuh: dropout's mask as a hash of (seed, step, site, element), so a GPU
//! kernel draws the same mask as the CPU without a generator's state, a step repeats to the bit, and a
//! CUDA graph replays many steps by reading the step number from device memory.
//!
//! A site is one place in a network that drops values (a layer of `textnet fit`, one of the Transformer's
//! dropouts); each has its own key per step. Within a site, element `e` (its flat index, as the site
//! defines it) survives when `mix32(key ^ mix32(e)) >= threshold`, and survivors are scaled by 1/(1 − p).

/// 32-bit integer hash (Chris Wellons' lowbias32): every input bit moves every output bit.
pub fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// The per-run part of site `site`'s key, mix32(seed ^ site·0x9e3779b9): the host passes it to a kernel,
/// which adds the step from device memory (dropout.cuh `dropout_key`).
pub fn site_seed(seed: u32, site: usize) -> u32 {
    mix32(seed ^ (site as u32).wrapping_mul(0x9e37_79b9))
}

/// Which dropout masks a training step draws: the run's seed and the step's number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropoutKey {
    /// From `--seed`.
    pub seed: u32,
    /// Optimizer steps taken before this one.
    pub step: u32,
}

/// The seed of micro-batch `micro` of a step whose gradient is summed over several (`--grad-accum`): the
/// run's own for the first, so that a step of one micro-batch draws the masks it always drew, and a fresh one
/// for each later micro-batch, whose sequences are numbered from 0 again.
pub fn micro_seed(seed: u32, micro: usize) -> u32 {
    if micro == 0 { seed } else { mix32(seed ^ (micro as u32).wrapping_mul(0x85eb_ca6b)) }
}

impl DropoutKey {
    /// The hash key of site `site`'s mask in this step.
    pub fn site_key(self, site: usize) -> u32 {
        mix32(site_seed(self.seed, site).wrapping_add(self.step))
    }
}

/// The hash threshold below which dropout with probability `p` drops a value (0: keeps every value).
pub fn dropout_threshold(p: f32) -> u32 {
    (p as f64 * 4_294_967_296.0).min(u32::MAX as f64) as u32
}

/// The factor survivors are scaled by, 1/(1 − p), rounded once from f64 as the kernels receive it.
pub fn dropout_scale(p: f32) -> f32 {
    (1.0 / (1.0 - p as f64)) as f32
}

/// Whether element `element` of a site survives under `key` and `threshold`.
pub fn dropout_keeps(key: u32, element: u32, threshold: u32) -> bool {
    mix32(key ^ mix32(element)) >= threshold
}

/// One site's mask in one step: its key, threshold and scale. `None` where dropout is off.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mask {
    /// The site's key in this step (`DropoutKey::site_key`).
    pub key: u32,
    /// `dropout_threshold(p)`.
    pub threshold: u32,
    /// `dropout_scale(p)`.
    pub scale: f32,
}

impl Mask {
    /// Site `site`'s mask for probability `p` under `key`, or `None` when `p` is 0 or there is no key
    /// (evaluation).
    pub fn new(key: Option<DropoutKey>, site: usize, p: f32) -> Option<Mask> {
        let key = key.filter(|_| p > 0.0)?;
        Some(Mask { key: key.site_key(site), threshold: dropout_threshold(p), scale: dropout_scale(p) })
    }

    /// The factor element `element` is multiplied by: the scale or 0.
    pub fn factor(&self, element: usize) -> f32 {
        if dropout_keeps(self.key, element as u32, self.threshold) { self.scale } else { 0.0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_fraction_is_one_minus_p() {
        let mask = Mask::new(Some(DropoutKey { seed: 7, step: 3 }), 2, 0.3).unwrap();
        let kept = (0..100_000).filter(|&e| mask.factor(e) != 0.0).count() as f64 / 100_000.0;
        assert!((kept - 0.7).abs() < 0.01, "kept {kept}");
    }

    #[test]
    fn sites_and_steps_draw_different_masks() {
        let key = |step| DropoutKey { seed: 1, step };
        assert_ne!(key(0).site_key(0), key(1).site_key(0));
        assert_ne!(key(0).site_key(0), key(0).site_key(1));
        assert!(Mask::new(Some(key(0)), 0, 0.0).is_none());
        assert!(Mask::new(None, 0, 0.5).is_none());
    }
}
