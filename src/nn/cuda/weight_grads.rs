//! Linear layers' weight gradients launched together. A layer's dW = dyᵀ·x and db = Σ rows of dy
//! (`nn_linear_grad_weight`) are read by nothing but the optimizer, so the backward defers each such launch
//! ([`Device::defer_weight_grad`]): it waits for the device's next launch or copy, or for the backward's
//! end ([`Device::launch_pending`]). Two or more waiting go as one launch of `nn_linear_grad_weights`, a
//! table of jobs (`WeightGradTable` of fused/nn.cu), each in the tile its own launch would take, so each
//! gradient has its own launch's bits in one launch's time. In a small MLP's captured step the last layer's
//! dW (its dx came with the loss, `nn_linear_cross_entropy`) and the first layer's run together. Flushed by
//! a launch of the backward's, they run on its second stream (branch.rs), beside the chain of input
//! gradients that goes on (in the ResNet example's step, the head's dW beside its max pool's and
//! convolutions' input gradients); at the backward's end, on the main stream, where nothing is left to
//! run beside them and a fork would only add its join to the step (the MLP's captured step took 22.65 µs
//! against 22.07).

use super::ops::{int, optional};
use super::table::{Field, address, field, first_blocks, int_value, table_bytes};
use super::{Device, DeviceBuffer};
use crate::device::launch::{Arg, StructArg};
use crate::nn::error::Result;

/// Jobs a launch takes (WEIGHT_GRAD_TABLE_JOBS in fused/nn.cu).
const WEIGHT_GRAD_TABLE_JOBS: usize = 8;

/// fused/nn.cu's `WeightGradTable`.
pub(super) const WEIGHT_GRAD_TABLE: [Field; 10] = [
    field("dy", 8, WEIGHT_GRAD_TABLE_JOBS),
    field("x", 8, WEIGHT_GRAD_TABLE_JOBS),
    field("dW", 8, WEIGHT_GRAD_TABLE_JOBS),
    field("db", 8, WEIGHT_GRAD_TABLE_JOBS),
    field("rows", 4, WEIGHT_GRAD_TABLE_JOBS),
    field("outputs", 4, WEIGHT_GRAD_TABLE_JOBS),
    field("inputs", 4, WEIGHT_GRAD_TABLE_JOBS),
    field("tile", 4, WEIGHT_GRAD_TABLE_JOBS),
    field("first_block", 4, WEIGHT_GRAD_TABLE_JOBS + 1),
    field("count", 4, 1),
];

/// One layer's dW (outputs × inputs) and db (of outputs, when the layer has a bias) from dy (rows ×
/// outputs) and x (rows × inputs), in the fp32 tile at `tile` of [`super::FP32_TILES`], whose own launch
/// has the grid `grid`. The job holds its buffers until it launches.
pub(crate) struct WeightGradJob {
    pub(crate) dy: DeviceBuffer,
    pub(crate) x: DeviceBuffer,
    pub(crate) dw: DeviceBuffer,
    pub(crate) db: Option<DeviceBuffer>,
    pub(crate) sizes: (usize, usize, usize),
    pub(crate) tile: usize,
    pub(crate) grid: (u32, u32),
}

impl Device {
    /// Defers `job` until the next launch or copy on this device, or the backward's end.
    pub(crate) fn defer_weight_grad(&self, job: WeightGradJob) {
        self.pending_weight_grads.lock().unwrap_or_else(|p| p.into_inner()).push(job);
    }

    /// Launches the deferred weight gradients where launches go now: one alone as its own
    /// `nn_linear_grad_weight_{tile}`, more as `nn_linear_grad_weights`, a launch per table of jobs.
    pub(crate) fn launch_pending(&self) -> Result<()> {
        match self.take_pending() {
            Some(jobs) => self.launch_weight_grads(&jobs),
            None => Ok(()),
        }
    }

    /// `launch_pending` on the backward's second stream, for a launch about to go on beside them.
    pub(crate) fn launch_pending_beside(&self) -> Result<()> {
        let Some(jobs) = self.take_pending() else {
            return Ok(());
        };
        let reads: Vec<&DeviceBuffer> = jobs.iter().flat_map(|job| [&job.dy, &job.x]).collect();
        self.on_branch(&reads, || {
            for job in &jobs {
                // Allocated before the fork, written on the branch: the main stream joins before it reads them.
                job.db.iter().chain([&job.dw]).for_each(|b| self.allocated(b));
            }
            self.launch_weight_grads(&jobs)
        })
    }

    /// The deferred weight gradients, taken (none: `None`).
    fn take_pending(&self) -> Option<Vec<WeightGradJob>> {
        let mut pending = self.pending_weight_grads.lock().unwrap_or_else(|p| p.into_inner());
        (!pending.is_empty()).then(|| std::mem::take(&mut *pending))
    }

    /// The launches of `jobs`, where launches go now.
    fn launch_weight_grads(&self, jobs: &[WeightGradJob]) -> Result<()> {
        const NAME: &str = "linear";
        if let [job] = jobs {
            let (rows, outputs, inputs) = job.sizes;
            let args = [self.arg(&job.dy), self.arg(&job.x), self.arg(&job.dw), optional(self, job.db.as_ref())];
            let sizes = [int(NAME, rows)?, int(NAME, outputs)?, int(NAME, inputs)?].map(Arg::i32);
            let kernel = &self.kernels.linear_grad_weight[job.tile];
            return self.launch(NAME, kernel, job.grid, self.gemm_shared[job.tile], &[&args[..], &sizes].concat());
        }
        if self.is_fusing() {
            self.fused(format!("linear ← linear: {} layers' weight gradients in one launch", jobs.len()));
        }
        for run in jobs.chunks(WEIGHT_GRAD_TABLE_JOBS) {
            let first = first_blocks(NAME, run.iter().map(|job| (job.grid.0 * job.grid.1) as usize), 1)?;
            let blocks = *first.last().expect("first_blocks starts at 0") as u32;
            let ints = |pick: fn(&WeightGradJob) -> usize| -> Result<Vec<u64>> {
                run.iter().map(|job| int_value(NAME, pick(job))).collect()
            };
            let values = [
                run.iter().map(|job| job.dy.address()).collect(),
                run.iter().map(|job| job.x.address()).collect(),
                run.iter().map(|job| job.dw.address()).collect(),
                run.iter().map(|job| address(job.db.as_ref())).collect(),
                ints(|job| job.sizes.0)?,
                ints(|job| job.sizes.1)?,
                ints(|job| job.sizes.2)?,
                ints(|job| job.tile)?,
                first,
                vec![run.len() as u64],
            ];
            let table = StructArg::new(&table_bytes(&WEIGHT_GRAD_TABLE, &values));
            let shared = run.iter().map(|job| self.gemm_shared[job.tile]).max().unwrap_or(0);
            if blocks > 0 {
                self.launch_struct(NAME, &self.kernels.linear_grad_weights, ((blocks, 1), shared), &table, &[])?;
            }
        }
        Ok(())
    }
}
