//! A training step captured once and replayed as one CUDA graph (`torch.cuda.graphs`, tinygrad's
//! `TinyJit`): [`CapturedStep::run`] runs the user's step closure (forward, loss, backward, optimizer
//! step) op by op the first two times; the third time it records the closure's launches into a graph
//! instead of running them, and replays the graph; from then on it only replays. Each call is one step.
//! Two eager runs, as PyTorch's warm-up before a capture: the first makes what lives on (optimizer state,
//! dropout counters), possibly from memory the step's temporaries then lack, so the second leaves in the
//! cache every buffer a step needs.
//!
//! The first eager run is recorded, and from the second on chains of ops are fused into the kernel that
//! makes their input (`fusion`: an activation into the product's epilogue, a residual add into the
//! LayerNorm that reads it, bf16 operands written by their producers), so the last warm-up run leaves in
//! the cache the buffers the fused capture takes; [`CapturedStep::fusions`] lists the fusions.
//!
//! What makes a replay the same step as an eager one:
//! - the inputs are device tensors the caller refills in place between calls (`copy_from_slice`), so
//!   their addresses stay; targets go through `cross_entropy_ids`, a tensor too. Or the caller hands each
//!   call its own tensors of the inputs' shapes ([`CapturedStep::run_with`]): a replay then reads them
//!   where they are (`device::rebind`: the graph's kernels that take an input's address are pointed at
//!   theirs, no copy), and the eager and capturing runs copy them into the inputs;
//! - every buffer the step uses comes from the memory its eager run used, and stays the step's (a pool
//!   of its own, `Device::capturing`): 0 device allocations while replaying;
//! - parameters and optimizer state are updated in place, and the rate and step count the update kernels
//!   read live on the device (`Optimizer::set_lr` writes the rate there);
//! - a copy between host and device inside the step is refused (it would replay stale host values).
//!
//! The inputs' shapes and addresses are the graph's signature: when one changes, the step is run eagerly
//! again and captured again, and this is said once. A step that cannot be captured runs op by op, said
//! once with the reason: it copies between host and device (the functional `embedding` with ids from the
//! host: the `Embedding` layer on a tensor of ids does not), draws a mask with the functional `dropout`
//! (its step is a host argument: the `Dropout` layer counts on the device), or needs memory its warm-up
//! runs did not (after one more eager run and a second try: another captured step may have taken the
//! buffers this one's warm-up freed).

use super::fusion::Plan;
use super::{Device, DeviceBuffer, Pool};
use crate::device::rebind::Rebinding;
use crate::nn::error::{Error, Result};
use crate::nn::tensor::{Storage, Tensor};
use cudarc::driver::CudaGraph;
use std::sync::Arc;

/// A step's input as the graph saw it: its shape and device address.
#[derive(Clone, Debug, PartialEq)]
struct Signature(Vec<(Vec<usize>, u64)>);

/// Eager runs before a capture.
const WARM_UP_RUNS: usize = 2;

enum State {
    /// This many eager runs so far for the current signature (fewer than `WARM_UP_RUNS`).
    Fresh(usize),
    /// Ran eagerly `WARM_UP_RUNS` times; the next call captures.
    WarmedUp,
    /// Captured: replay `graph`, whose output is `output`; its buffers live in `pool` and in the tensors.
    /// `rebinding` (None: the graph touches its inputs otherwise than through its kernels' arguments)
    /// points its kernels at other buffers than the inputs; `bound` holds those they read now (not the
    /// inputs' own: a second holder would keep a refill from writing them in place).
    Captured {
        graph: CudaGraph,
        output: Tensor,
        _pool: Arc<Pool>,
        rebinding: Option<Rebinding>,
        bound: Vec<DeviceBuffer>,
    },
    /// Capture failed for the reason given once; every call runs eagerly.
    Eager,
}

/// A training step replayed as a CUDA graph (see the module's text).
///
/// ```no_run
/// use textnet::nn::{CapturedStep, Device, Linear, Module, Optimizer, Tensor};
/// # fn main() -> textnet::nn::Result<()> {
/// let device = Device::open(0)?;
/// let mut rng = <textnet::ops::cpu::SeededRng as rand::SeedableRng>::seed_from_u64(1);
/// let layer = Linear::<f32>::new(784, 10, true, &mut rng)?;
/// layer.parameters().iter().try_for_each(|p| p.move_to_device(&device))?;
/// let x = Tensor::zeros(&[64, 784])?.to_device(&device)?;
/// let y = Tensor::zeros(&[64])?.to_device(&device)?;
/// let mut adam = Optimizer::adam(layer.parameters(), 1e-3)?;
/// let mut step = CapturedStep::new(&device, &[&x, &y])?;
/// for _ in 0..100 {
///     // x.copy_from_slice(images)?; y.copy_from_slice(labels)?;
///     let loss = step.run(|| {
///         adam.zero_grad();
///         let loss = layer.forward(&x)?.cross_entropy_ids(&y, None)?;
///         loss.backward()?;
///         adam.step()?;
///         Ok(loss)
///     })?;
///     let _ = loss; // read it with loss.item() when wanted: that waits for the GPU
/// }
/// # Ok(())
/// # }
/// ```
pub struct CapturedStep {
    device: Arc<Device>,
    inputs: Vec<Tensor>,
    signature: Option<Signature>,
    state: State,
    captures: usize,
    /// Whether a failed capture was already tried again.
    retried: bool,
    /// The fusions the last capture made, with their counts.
    fusions: Vec<(String, usize)>,
    /// What the recording run found to fuse, for the fused runs after it.
    plan: Plan,
}

impl CapturedStep {
    /// A step over `inputs` (device tensors on `device` that the caller refills between calls).
    pub fn new(device: &Arc<Device>, inputs: &[&Tensor]) -> Result<Self> {
        let step = CapturedStep {
            device: Arc::clone(device),
            inputs: inputs.iter().map(|&t| t.clone()).collect(),
            signature: None,
            state: State::Fresh(0),
            captures: 0,
            retried: false,
            fusions: Vec::new(),
            plan: Plan::default(),
        };
        step.current_signature()?;
        Ok(step)
    }

    /// How many times the step was captured (1 unless its inputs changed shape or place).
    pub fn captures(&self) -> usize {
        self.captures
    }

    /// Whether the next call replays a graph.
    pub fn is_captured(&self) -> bool {
        matches!(self.state, State::Captured { .. })
    }

    /// How many of the captured graph's kernels take an input's address, which `run_with`'s replays point
    /// at the tensors handed to them; None before a capture, or when the graph cannot be rebound (they are
    /// then copied into the inputs).
    pub fn rebound_kernels(&self) -> Option<usize> {
        match &self.state {
            State::Captured { rebinding, .. } => rebinding.as_ref().map(Rebinding::kernels),
            _ => None,
        }
    }

    /// The inputs' buffers (each a device tensor: `current_signature` checked them).
    fn input_buffers(&self) -> Vec<DeviceBuffer> {
        let buffer = |input: &Tensor| match &*input.storage() {
            Storage::Device(buffer) => Some(buffer.clone()),
            Storage::Host(_) => None,
        };
        self.inputs.iter().filter_map(buffer).collect()
    }

    fn current_signature(&self) -> Result<Signature> {
        let mut parts = Vec::new();
        for input in &self.inputs {
            let Storage::Device(buffer) = &*input.storage() else {
                return Err(Error::device("CapturedStep", format!("input {:?} is not on the GPU", input.shape())));
            };
            if !Arc::ptr_eq(buffer.device(), &self.device) {
                return Err(Error::device("CapturedStep", "an input lives on another GPU"));
            }
            parts.push((input.shape().to_vec(), buffer.address()));
        }
        Ok(Signature(parts))
    }

    /// One step: `step` (which returns the loss, or any output) run eagerly, captured then replayed, or
    /// replayed. The output of a replayed step is the same tensor each time, holding this step's values.
    pub fn run(&mut self, step: impl FnMut() -> Result<Tensor>) -> Result<Tensor> {
        let inputs = self.input_buffers();
        self.run_bound(&inputs, Vec::new(), step)
    }

    /// `run` over `sources` (device tensors on this step's GPU, of its inputs' shapes, one for each) in
    /// place of the inputs: a replay reads them where they are when its graph allows it (see the module's
    /// text); otherwise, and in the eager and capturing runs, they are first copied into the inputs.
    /// `step` still reads the inputs. The step keeps the sources until its next call.
    pub fn run_with(&mut self, sources: &[&Tensor], step: impl FnMut() -> Result<Tensor>) -> Result<Tensor> {
        if sources.len() != self.inputs.len() {
            let problem = format!("{} tensors given for a step of {} inputs", sources.len(), self.inputs.len());
            return Err(Error::value("CapturedStep", problem));
        }
        let mut buffers = Vec::with_capacity(sources.len());
        // The handed tensors that are not an input itself: a replay keeps these (holding an input's own
        // buffer too would keep a refill from writing it in place).
        let mut handed = Vec::new();
        // Addresses only: a clone of an input's buffer held through the copies below would keep them from
        // writing it in place.
        let inputs: Vec<u64> = self.input_buffers().iter().map(DeviceBuffer::address).collect();
        for ((source, input), &input_address) in sources.iter().zip(&self.inputs).zip(&inputs) {
            if source.shape() != input.shape() {
                let problem = "differ: a step's tensors have its inputs' shapes (second shape: the input's)";
                return Err(Error::shapes("CapturedStep", source.shape(), input.shape(), problem));
            }
            let buffer = match &*source.storage() {
                Storage::Device(buffer) if Arc::ptr_eq(buffer.device(), &self.device) => buffer.clone(),
                _ => return Err(Error::device("CapturedStep", "a step's tensor is not on the step's GPU")),
            };
            if buffer.address() != input_address {
                handed.push((source, input, buffer.clone()));
            }
            buffers.push(buffer);
        }
        let replays_in_place = matches!(&self.state, State::Captured { rebinding: Some(_), .. })
            && self.signature.as_ref() == Some(&self.current_signature()?);
        if !replays_in_place {
            for (source, input, _) in handed {
                input.copy_from(source)?;
            }
            return self.run_bound(&self.input_buffers(), Vec::new(), step);
        }
        let kept = handed.into_iter().map(|(.., buffer)| buffer).collect();
        self.run_bound(&buffers, kept, step)
    }

    /// `run`, a replay reading `buffers` in place of the inputs (the inputs' own, or `run_with`'s sources
    /// when the graph can be rebound) and keeping `kept` until the next call.
    fn run_bound(
        &mut self,
        buffers: &[DeviceBuffer],
        kept: Vec<DeviceBuffer>,
        mut step: impl FnMut() -> Result<Tensor>,
    ) -> Result<Tensor> {
        let signature = self.current_signature()?;
        if self.signature.as_ref().is_some_and(|s| *s != signature) {
            if self.captures > 0 && !matches!(self.state, State::Eager) {
                eprintln!("textnet: a captured step's inputs changed shape or place; capturing it again");
            }
            if !matches!(self.state, State::Eager) {
                self.state = State::Fresh(0);
            }
        }
        self.signature = Some(signature);
        match &self.state {
            &State::Fresh(runs) => {
                let output = if runs == 0 { self.recorded(&mut step) } else { self.fused(&mut step) }?;
                self.state = if runs + 1 < WARM_UP_RUNS { State::Fresh(runs + 1) } else { State::WarmedUp };
                Ok(output)
            }
            State::Eager => step(),
            State::Captured { .. } => self.replay(buffers, kept),
            State::WarmedUp => match self.capture(&mut step) {
                Ok(()) => self.replay(buffers, kept),
                // The eager run that follows may leave in the cache the memory the capture lacked (another
                // captured step can take buffers this one's warm-up freed): one more try after it.
                Err(_) if !self.retried => {
                    self.retried = true;
                    let output = self.fused(&mut step)?;
                    self.state = State::WarmedUp;
                    Ok(output)
                }
                Err(reason) => {
                    eprintln!("textnet: the step runs op by op, not captured: {reason}");
                    self.state = State::Eager;
                    step()
                }
            },
        }
    }

    /// Launches the captured graph, its kernels reading `buffers` in place of the inputs (the inputs' own
    /// unless it has a rebinding), `kept` held until the next replay.
    fn replay(&mut self, buffers: &[DeviceBuffer], kept: Vec<DeviceBuffer>) -> Result<Tensor> {
        let State::Captured { graph, output, rebinding, bound, .. } = &mut self.state else {
            unreachable!("replayed only once captured")
        };
        if let Some(rebinding) = rebinding {
            let addresses: Vec<u64> = buffers.iter().map(DeviceBuffer::address).collect();
            (rebinding.bind(graph.cu_graph_exec(), &addresses))
                .map_err(|e| Error::device("CapturedStep", format!("replaying the step: {e}")))?;
            *bound = kept;
        }
        graph.launch().map_err(|e| Error::device("CapturedStep", format!("replaying the step: {e}")))?;
        Ok(output.clone())
    }

    /// The fusions the last capture made (`fusion`'s table), each described with how many times it was
    /// made: empty before a capture or when nothing fused.
    pub fn fusions(&self) -> &[(String, usize)] {
        &self.fusions
    }

    /// `step` run eagerly, as the recording that the fusions follow.
    fn recorded(&mut self, step: &mut impl FnMut() -> Result<Tensor>) -> Result<Tensor> {
        self.device.fusion_record(&self.input_buffers());
        let output = step();
        self.plan = self.device.fusion_end_recording();
        output
    }

    /// `step` run eagerly with the recording's fusions, so that it frees into the cache the buffers the
    /// fused capture then takes.
    fn fused(&self, step: &mut impl FnMut() -> Result<Tensor>) -> Result<Tensor> {
        self.device.fusion_apply(&self.plan, &self.input_buffers());
        let output = step();
        self.device.fusion_end();
        output
    }

    /// Records `step`'s launches as a graph (nothing runs), its buffers from a pool of its own.
    fn capture(&mut self, step: &mut impl FnMut() -> Result<Tensor>) -> Result<()> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        let device = &self.device;
        device.synchronize()?;
        let pool = Arc::new(Pool::default());
        let stream = &device.gpu.stream;
        let driver = |e: cudarc::driver::DriverError| Error::device("CapturedStep", format!("capturing the step: {e}"));
        *device.capturing.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&pool));
        let begun = stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(driver);
        device.fusion_apply(&self.plan, &self.input_buffers());
        let output = begun.and_then(|()| step()).and_then(|output| device.launch_pending().map(|()| output));
        // A capture ends with every stream it forked joined back into the one it began on.
        let output = output.and_then(|output| device.join_branch().map(|()| output));
        let fusions = device.fusion_end();
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        *device.capturing.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let output = output?;
        let graph = graph.map_err(driver)?.ok_or_else(|| Error::device("CapturedStep", "the step launched nothing"))?;
        let spans: Vec<(u64, usize)> =
            self.input_buffers().iter().map(|b| (b.address(), b.len() * size_of::<f32>())).collect();
        let rebinding = crate::device::quietly("reading the captured step", || {
            Rebinding::find(graph.cu_graph(), graph.cu_graph_exec(), &spans)
        })
        .map_err(|e| Error::device("CapturedStep", e.to_string()))?;
        self.captures += 1;
        self.fusions = fusions;
        self.state = State::Captured { graph, output, _pool: pool, rebinding, bound: Vec::new() };
        Ok(())
    }
}
