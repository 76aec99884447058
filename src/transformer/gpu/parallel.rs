//! Data parallelism over NCCL, as PyTorch DDP does it: every GPU holds a replica of the model and takes its
//! own share of each global batch, and the gradients are averaged over all GPUs bucket by bucket while the
//! backward pass is still running, so that every replica takes the same AdamW step.
//!
//! One process drives the GPUs of its host it was given (`--gpus`) from one thread: each replica's forward
//! and backward launches go on its own stream, each bucket's all-reduce on a second stream of that GPU that
//! waits for the bucket's event, one NCCL group per bucket over the process's replicas; the update waits
//! for the last all-reduce. Processes of several hosts (`--world-size`, `--rank`) run the same code with
//! one replica each, their communicator joined over the rendezvous's id. The steps run as launches, not as
//! a CUDA graph: at the sizes where data parallelism pays, a step is milliseconds of kernels and its
//! launches are a small part.
//!
//! ZeRO-1 (--zero), as DeepSpeed's stage 1 and PyTorch's ZeroRedundancyOptimizer: rank r updates only its
//! shard of the flat parameters ([`Shard`]) and keeps AdamW's moments for that shard alone, 1/W of them.
//! After the backward the gradient is reduce-scattered (each rank receives the mean of its shard), clipping
//! adds the ranks' squared norms of their shards, each rank steps its shard, and the parameters are
//! all-gathered. The collectives run on the compute stream after the whole backward (no buckets). On 2
//! GPUs the mean of two values is the same in either order and the norm is summed in double before it is
//! rounded, so the runs measured gave plain data parallelism's bits, with clipping too (BENCHMARKS.md).
//!
//! With --grad-accum k, a step is k global batches: each replica sums its first k − 1 micro-batches'
//! gradients, and only the last one's backward, each bucket with that sum added, is averaged.
//!
//! A replica of global rank g takes sequences g·b … (g + 1)·b − 1 of each global batch of W·b, so the same
//! seed, global batch and data order give the same model whatever W is, up to the all-reduce's order of
//! summation and except for dropout, whose masks each replica draws for its own rows (rank 0's are
//! the one-GPU run's).

use super::GpuTransformer;
use crate::device::Gpu;
use crate::device::nccl::{self, Comm};
use crate::device::parallel::Opened;
use anyhow::{Context, Result, anyhow, bail};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

/// ZeRO-1's split of the flat parameters (`len` of them) over `ranks` ranks: rank r updates elements
/// [r·per, min(len, (r + 1)·per)), per = ⌈len / ranks⌉. The collectives move ranks·per elements, so the
/// parameters and the gradient are padded to that (`padded`), the padding never read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// This rank's number, from 0.
    pub rank: usize,
    /// The ranks that share the parameters.
    pub ranks: usize,
    /// Elements a rank's shard (the last ones may hold fewer).
    pub per: usize,
    /// Elements in all.
    pub len: usize,
}

impl Shard {
    /// Rank `rank`'s shard of `len` elements split over `ranks`.
    pub fn new(len: usize, rank: usize, ranks: usize) -> Shard {
        Shard { rank, ranks, per: len.div_ceil(ranks.max(1)), len }
    }

    /// The elements this rank updates (empty for a rank past the last element).
    pub fn range(&self) -> Range<usize> {
        let start = (self.rank * self.per).min(self.len);
        start..(start + self.per).min(self.len)
    }

    /// The length of the buffers the collectives move: ranks · per.
    pub fn padded(&self) -> usize {
        self.ranks * self.per
    }
}

/// This process's replicas and their communicators.
pub struct Replicas {
    replicas: Vec<GpuTransformer>,
    comms: Vec<Comm>,
    /// Per replica: the stream its all-reduces run on.
    reduce_streams: Vec<Arc<CudaStream>>,
    /// Per replica and bucket: the point in its compute stream where the bucket is written.
    written: Vec<Vec<CudaEvent>>,
    /// Per replica: the point in its reduce stream where the step's last all-reduce ends.
    reduced: Vec<CudaEvent>,
    buckets: Vec<Range<usize>>,
    /// The global rank of replicas[0], and the number of ranks in all.
    first_rank: usize,
    world_size: usize,
}

impl Replicas {
    /// Replicas on the GPUs `opened` (`parallel::Plan::open`), each made by `make(gpu, global rank)` (the
    /// same parameters on every one), connected by its communicators.
    pub fn new(opened: &Opened, mut make: impl FnMut(Arc<Gpu>, usize) -> Result<GpuTransformer>) -> Result<Replicas> {
        let Opened { gpus, first_rank, world_size, .. } = opened;
        let mut replicas = Vec::new();
        for (i, gpu) in gpus.iter().enumerate() {
            gpu.ctx.bind_to_thread()?;
            replicas.push(make(gpu.clone(), first_rank + i)?);
        }
        let comms = opened.comms()?;
        let buckets = replicas[0].gradient_buckets();
        let event = |gpu: &Gpu| gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING));
        let mut reduce_streams = Vec::new();
        let mut written = Vec::new();
        let mut reduced = Vec::new();
        for gpu in gpus {
            reduce_streams.push(gpu.ctx.new_stream()?);
            written.push(buckets.iter().map(|_| event(gpu)).collect::<Result<Vec<_>, _>>()?);
            reduced.push(event(gpu)?);
        }
        let (first_rank, world_size) = (*first_rank, *world_size);
        Ok(Replicas { replicas, comms, reduce_streams, written, reduced, buckets, first_rank, world_size })
    }

    /// The replica the process reads parameters and validation losses from (every one holds the same).
    fn first(&mut self) -> Result<&mut GpuTransformer> {
        self.bind(0)?;
        Ok(&mut self.replicas[0])
    }

    /// The mean loss over validation windows at `offsets`, on the first replica in batches of its share of
    /// `batch` (the size its buffers have).
    pub fn val_loss(&mut self, offsets: &[u32], batch: usize) -> Result<f64> {
        let share = batch / self.world_size;
        self.first()?.val_loss(offsets, share)
    }

    /// The parameters, read from every replica of this process, which must hold the same bits (the
    /// all-reduce hands every rank the same average): a check that every bucket was reduced.
    pub fn params(&mut self) -> Result<Vec<f32>> {
        let params = self.first()?.params()?;
        for i in 1..self.replicas.len() {
            self.bind(i)?;
            let other = self.replicas[i].params()?;
            if let Some(at) = params.iter().zip(&other).position(|(a, b)| a.to_bits() != b.to_bits()) {
                bail!(
                    "internal: the replicas on GPUs {} and {} hold different parameters (first at {at})",
                    self.replicas[0].gpu.ctx.ordinal(),
                    self.replicas[i].gpu.ctx.ordinal()
                );
            }
        }
        Ok(params)
    }

    fn bind(&self, i: usize) -> Result<()> {
        Ok(self.replicas[i].gpu.ctx.bind_to_thread()?)
    }

    /// Steps over the global batches at `offsets` (`batch` sequences per micro-batch over all ranks, its
    /// share at each replica; `set_grad_accum`'s micro-batches a step) at the rates `rates`; returns each
    /// step's mean loss over its global batches.
    pub fn train_steps(&mut self, offsets: &[u32], batch: usize, rates: &[f32]) -> Result<Vec<f64>> {
        let steps = rates.len();
        let micro_batches = self.replicas[0].grad_accum;
        if !batch.is_multiple_of(self.world_size) || offsets.len() != steps * micro_batches * batch {
            bail!(
                "internal: {} offsets for {steps} steps of batch {batch} over {} GPUs",
                offsets.len(),
                self.world_size
            );
        }
        let share = batch / self.world_size;
        for (i, t) in self.replicas.iter_mut().enumerate() {
            t.gpu.ctx.bind_to_thread()?;
            let rank = self.first_rank + i;
            let mine: Vec<u32> =
                offsets.chunks(batch).flat_map(|micro| &micro[rank * share..(rank + 1) * share]).copied().collect();
            t.check_offsets(&mine, t.n_train, "training")?;
            t.reserve_steps(steps, share)?;
            let stream = t.gpu.stream.clone();
            stream.memcpy_htod(&mine, &mut t.offsets.slice_mut(..mine.len()))?;
            stream.memcpy_htod(rates, &mut t.rates.slice_mut(..steps))?;
            stream.memset_zeros(&mut t.losses)?;
        }
        for s in 0..steps {
            if self.replicas[0].shard.is_some() {
                self.enqueue_zero_step(s)?;
            } else {
                self.enqueue_step(s)?;
            }
        }
        // Each step's loss sums, added over every rank.
        nccl::group(|| {
            for (i, t) in self.replicas.iter().enumerate() {
                self.comms[i].sum_f64(t.ptr(&t.losses), steps, &t.gpu.stream)?;
            }
            Ok(())
        })?;
        self.wait()?;
        let t = self.first()?;
        let sums = t.gpu.stream.clone_dtoh(&t.losses).context("reading the step losses")?;
        let rows = (micro_batches * batch * t.config.block) as f64;
        Ok(sums[..steps].iter().map(|s| s / rows).collect())
    }

    /// Step `s` of the offsets and rates uploaded.
    fn enqueue_step(&self, s: usize) -> Result<()> {
        for (i, t) in self.replicas.iter().enumerate() {
            self.bind(i)?;
            t.enqueue_micro_batches(s, &mut |t, offsets| {
                t.enqueue_backward_in_buckets(offsets, &mut |b| {
                    t.enqueue_add_sum(self.buckets[b].clone())?;
                    Ok(self.written[i][b].record(&t.gpu.stream)?)
                })
            })?;
        }
        for (b, range) in self.buckets.iter().enumerate() {
            nccl::group(|| {
                for (i, t) in self.replicas.iter().enumerate() {
                    let stream = &self.reduce_streams[i];
                    stream.wait(&self.written[i][b])?;
                    self.comms[i].average_f32(t.ptr(&t.grad) + 4 * range.start as u64, range.len(), stream)?;
                }
                Ok(())
            })?;
        }
        for (i, t) in self.replicas.iter().enumerate() {
            self.reduced[i].record(&self.reduce_streams[i])?;
            t.gpu.stream.wait(&self.reduced[i])?;
            self.bind(i)?;
            t.enqueue_update(t.step_rate(s))?;
        }
        Ok(())
    }

    /// Step `s` as ZeRO-1 takes it (the module's notes), every collective on the replicas' compute streams.
    fn enqueue_zero_step(&self, s: usize) -> Result<()> {
        let each = |enqueue: &dyn Fn(&GpuTransformer) -> Result<()>| -> Result<()> {
            for (i, t) in self.replicas.iter().enumerate() {
                self.bind(i)?;
                enqueue(t)?;
            }
            Ok(())
        };
        let collective = |call: &dyn Fn(&Comm, &GpuTransformer, Shard) -> Result<()>| -> Result<()> {
            nccl::group(|| {
                for (i, t) in self.replicas.iter().enumerate() {
                    call(&self.comms[i], t, t.shard.expect("a ZeRO-1 replica has its shard"))?;
                }
                Ok(())
            })
        };
        each(&|t| t.enqueue_micro_batches(s, &mut |t, offsets| t.enqueue_whole_backward(offsets)))?;
        collective(&|comm, t, shard| comm.average_shard_f32(t.ptr(&t.grad), shard.per, shard.rank, &t.gpu.stream))?;
        if self.replicas[0].optim.clip_norm > 0.0 {
            each(&|t| t.enqueue_grad_norm())?;
            collective(&|comm, t, _| comm.sum_f64(t.ptr(&t.norm_sq), 1, &t.gpu.stream))?;
            each(&|t| t.enqueue_clip_scale())?;
        }
        each(&|t| t.enqueue_adamw(t.step_rate(s)))?;
        collective(&|comm, t, shard| comm.gather_shards_f32(t.ptr(&t.params), shard.per, shard.rank, &t.gpu.stream))?;
        if self.replicas[0].bf16() {
            each(&|t| t.enqueue_round_bf16())?;
        }
        Ok(())
    }

    /// Waits for every replica's work, watching for a GPU error or an NCCL error on any of them: then
    /// every communicator is aborted (so that no GPU waits on a peer that will never come) and the error
    /// names the GPU.
    fn wait(&mut self) -> Result<()> {
        let mut done = Vec::new();
        for t in &self.replicas {
            done.push(t.gpu.stream.record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))?);
        }
        let mut pending: Vec<usize> = (0..done.len()).collect();
        while !pending.is_empty() {
            let mut failure = None;
            pending.retain(|&i| match done[i].try_is_complete() {
                Ok(complete) => !complete,
                Err(e) => {
                    failure
                        .get_or_insert(anyhow!("{e:?}").context(format!("GPU {}", self.replicas[i].gpu.ctx.ordinal())));
                    false
                }
            });
            for (i, comm) in self.comms.iter().enumerate() {
                if failure.is_none()
                    && let Err(e) = comm.async_error()
                {
                    failure = Some(e.context(format!("GPU {}", self.replicas[i].gpu.ctx.ordinal())));
                }
            }
            if let Some(e) = failure {
                for comm in &mut self.comms {
                    comm.abort();
                }
                return Err(e);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }
}
