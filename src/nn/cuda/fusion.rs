//! Capture-time fusion: while a step is captured ([`super::CapturedStep`]), an op whose output an
//! elementwise op reads next computes that op's result in the same launch, and the reader takes it
//! instead of launching: fewer launches, and the intermediate is not read back from memory.
//!
//! | producer → reader | the one launch |
//! |---|---|
//! | `linear` → `relu`, `gelu`, `tanh`, `sigmoid`, … | the activation in the product's epilogue (the pre-activation is still written: the activation's backward reads it) |
//! | `conv2d` (fp32, direct) → `relu` | the ReLU in the window walk's stores, likewise |
//! | `add` → `layer_norm` | the rows added, the sum written (the residual stream goes on) and normalized (`nn_layer_norm` with `x2`) |
//! | `add` (operands of one shape) → `relu` | the sum and its ReLU in one launch (`nn_add_relu`), the sum still written |
//! | `conv2d` (fp32, direct) → `add` (of another producer's output, one shape) → `relu` | the sum and its ReLU in the window walk's stores, beside the convolution's own result: a residual block's end, no launch of `nn_add_relu` |
//! | `layer_norm`, or the two above → a bf16 product | the bf16 copy the product reads, written beside the fp32 result |
//! | `linear` → `Dropout` (counted on the device) | the mask in the product's epilogue: the linear layer draws the dropout's key for this step and writes the dropped output beside its own |
//! | `linear` (fp32, no activation, ≤ 64 outputs) → `cross_entropy` | the loss of each row of logits, its gradient and their mean, by the block that formed the row (`nn_linear_cross_entropy`) |
//!
//! | `linear` (as above, its input needing a gradient) → `cross_entropy` → the backward | also the layer's dx = d·W (times the slope of the activation that made the input, where one did), by the same blocks, in the sums nn_linear_grad's tile forms: the backward launches the weight gradients only |
//!
//! Cross-entropy's softmax is inside its own kernel already. Apart from these, the backward defers each
//! linear layer's weight gradients and launches those that meet as one (`weight_grads`).
//!
//! How: a producer cannot know at its launch who will read its output, so the first eager run of a step
//! is recorded. Every op that can produce more (a *producer*) takes the next number of the step,
//! marks its output buffer with it, and each reader of a marked buffer records what it would have taken
//! from that producer ([`Want`]). The runs after it (the last eager warm-up run, so that the fused step's
//! buffers are in the cache, and the capture) hand each producer the list recorded for its number
//! (when the op at that number has the recorded name); the producer attaches what it computed to its
//! output buffer ([`Extra`]), where the reader finds it. A reader that finds nothing launches as before,
//! so a step that runs differently from its recording only loses fusions, never changes its results; the
//! fused kernels compute the very same expressions as the chains they replace, so a captured step equals
//! the same step op by op to the bit (`selftest --only nn` checks it). Outside a `CapturedStep` nothing
//! changes.
//!
//! A fused dropout draws its key (and advances its layer's step) at the linear layer's launch, not at its
//! own. So it fuses only where no other mask was drawn between the two in the recording: otherwise a layer
//! drawing twice could take its steps in another order.
//!
//! The backward's fusions (an activation's slope, a gradient's addend in the input gradient) are in
//! `backward_fusion.rs`. `TEXTNET_FUSION=0` turns fusion off.

use super::{Device, DeviceBuffer, WeakBuffer};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// What a reader would take from the producer of its input.
#[derive(Clone)]
pub(crate) enum Want {
    /// The activation `code` (UNARY_*) of a product's output; `bf16`: its bf16 copy too. `reader` is the
    /// activation's own producer number (a product reading the activation asks it for the copy).
    Activation { code: i32, reader: usize, bf16: bool },
    /// LayerNorm of a sum of two operands, with these parameters; `bf16` as above.
    LayerNorm { params: NormParams, reader: usize, bf16: bool },
    /// The output's bf16 copy (a bf16 product's operand).
    Bf16,
    /// The output times a dropout mask counted on the device.
    Dropout(DropoutSite),
    /// The cross-entropy of the output, rows of logits.
    CrossEntropy(CrossEntropySite),
    /// The sum of the output and the output of producer `other` (of one shape), made by the add `reader`,
    /// whose own reader wants its ReLU.
    Residual { other: usize, reader: usize },
}

/// A cross-entropy of `rows` rows of `classes` logits against the class ids in the step's input `input`
/// (the targets must be one: a buffer that lives through the step at one address), ignoring the rows whose
/// id is `ignore` (NaN: none), its gradient times `row_scale`.
#[derive(Clone, Copy)]
pub(crate) struct CrossEntropySite {
    pub(crate) input: usize,
    pub(crate) rows: usize,
    pub(crate) classes: usize,
    pub(crate) ignore: f32,
    pub(crate) row_scale: f32,
}

impl CrossEntropySite {
    /// Whether `other` is the same cross-entropy (the same targets, shape, ignored id and scale).
    fn same(&self, other: &CrossEntropySite) -> bool {
        (self.input, self.rows, self.classes) == (other.input, other.rows, other.classes)
            && self.ignore.to_bits() == other.ignore.to_bits()
            && self.row_scale.to_bits() == other.row_scale.to_bits()
    }
}

/// What a cross-entropy launch writes: each row's loss, the rows' gradient (softmax − onehot, scaled),
/// whether each row counted, the mean, the count and the word 1 (its backward's seed).
#[derive(Clone)]
pub(crate) struct CrossEntropyOut {
    pub(crate) losses: DeviceBuffer,
    pub(crate) d: DeviceBuffer,
    pub(crate) counted: DeviceBuffer,
    pub(crate) loss: DeviceBuffer,
    pub(crate) count: DeviceBuffer,
    pub(crate) one: DeviceBuffer,
}

/// A dropout whose mask is drawn on the device: its layer's step word (held weakly, as LayerNorm's
/// parameters), its site's seed, and the mask's threshold and scale.
#[derive(Clone)]
pub(crate) struct DropoutSite {
    pub(crate) step: WeakBuffer,
    pub(crate) site_seed: u32,
    pub(crate) threshold: u32,
    pub(crate) scale: f32,
}

impl DropoutSite {
    /// Whether the dropout drawing from `step` at `site_seed` with `threshold` and `scale` is this one.
    pub(crate) fn matches(&self, step: &DeviceBuffer, site_seed: u32, threshold: u32, scale: f32) -> bool {
        self.step.is(step)
            && self.site_seed == site_seed
            && self.threshold == threshold
            && self.scale.to_bits() == scale.to_bits()
    }
}

/// The parameters of a LayerNorm: its weight and bias (None: 1 and 0), ε and the row width. The weight and
/// bias are held weakly: a held parameter would be shared, and the optimizer would then update a copy.
#[derive(Clone)]
pub(crate) struct NormParams {
    pub(crate) weight: Option<WeakBuffer>,
    pub(crate) bias: Option<WeakBuffer>,
    pub(crate) eps: f32,
    pub(crate) width: usize,
}

impl NormParams {
    /// The parameters of a LayerNorm reading `weight` and `bias`.
    pub(crate) fn new(weight: Option<&DeviceBuffer>, bias: Option<&DeviceBuffer>, eps: f32, width: usize) -> Self {
        NormParams { weight: weight.map(DeviceBuffer::downgrade), bias: bias.map(DeviceBuffer::downgrade), eps, width }
    }

    /// The weight and bias, while they live (None when one of them was dropped).
    pub(crate) fn buffers(&self, device: &Arc<Device>) -> Option<(Option<DeviceBuffer>, Option<DeviceBuffer>)> {
        let live = |b: &Option<WeakBuffer>| match b {
            None => Some(None),
            Some(weak) => weak.upgrade(device).map(Some),
        };
        Some((live(&self.weight)?, live(&self.bias)?))
    }

    /// Whether a LayerNorm reading `weight` and `bias` with ε `eps` over rows of `width` has these.
    pub(crate) fn matches(
        &self,
        weight: Option<&DeviceBuffer>,
        bias: Option<&DeviceBuffer>,
        eps: f32,
        width: usize,
    ) -> bool {
        let same = |mine: &Option<WeakBuffer>, theirs: Option<&DeviceBuffer>| match (mine, theirs) {
            (None, None) => true,
            (Some(mine), Some(theirs)) => mine.is(theirs),
            _ => false,
        };
        same(&self.weight, weight)
            && same(&self.bias, bias)
            && self.eps.to_bits() == eps.to_bits()
            && self.width == width
    }
}

/// A result a producer computed for a reader of its output, attached to that output.
#[derive(Clone)]
pub(crate) enum Extra {
    /// The activation `code` of these elements, computed by the op `by` that made them.
    Activation {
        code: i32,
        out: DeviceBuffer,
        by: &'static str,
    },
    LayerNorm {
        params: NormParams,
        y: DeviceBuffer,
        mean: DeviceBuffer,
        rstd: DeviceBuffer,
    },
    Bf16(DeviceBuffer),
    /// The output dropped by `site`'s mask under `key` (the step's key, drawn by the producer).
    Dropout {
        site: DropoutSite,
        out: DeviceBuffer,
        key: DeviceBuffer,
    },
    /// The cross-entropy of these elements for `site`, computed by the product that made them from the
    /// targets `targets` (a buffer's identity) when the device had made `writes` in-place writes.
    CrossEntropy {
        site: CrossEntropySite,
        targets: usize,
        writes: usize,
        out: CrossEntropyOut,
    },
    /// The sum of these elements and `other`'s, and its ReLU, computed by their producer when the device
    /// had made `writes` in-place writes.
    Residual {
        other: WeakBuffer,
        writes: usize,
        sum: DeviceBuffer,
        activated: DeviceBuffer,
    },
    /// A word holding 1 that the kernel making a scalar output wrote for the seed of its backward (not a
    /// fusion: the seed then costs no launch, and the op knows its upstream gradient is 1).
    Seed(DeviceBuffer),
    /// These elements are the unary map `code` (UNARY_*) of `input`: its slope can be taken in the
    /// backward of their reader (held weakly: the activation's backward keeps it while it is needed).
    Slope {
        code: i32,
        input: WeakBuffer,
    },
}

/// What fusion is doing in the current run of a step.
#[derive(Clone, Copy, Default, PartialEq)]
enum Phase {
    #[default]
    Off,
    /// The eager run before a capture: producers are numbered, readers' wants recorded.
    Recording,
    /// A fused run (the last warm-up, then the capture): producers get their recorded wants.
    Applying,
}

/// A step's fusion plan: by producer number, its op and the wants its readers recorded in the step's
/// recording run. Each `CapturedStep` keeps its own.
#[derive(Clone, Default)]
pub(crate) struct Plan(Vec<(&'static str, Vec<Want>)>);

/// A device's fusion state in the run under way (see the module's text).
#[derive(Default)]
pub(crate) struct Fusion {
    phase: Phase,
    /// Producers so far in this run.
    next: usize,
    /// The plan being recorded, or the one being applied.
    recorded: Vec<(&'static str, Vec<Want>)>,
    /// Masks drawn on the device so far in the recording run, and the count when each producer ran.
    draws: usize,
    draws_at: Vec<usize>,
    /// The fusions this run made, by description, with their counts.
    applied: BTreeMap<String, usize>,
    /// The step's inputs (identity, address), which live through it at fixed addresses.
    inputs: Vec<(usize, u64)>,
    /// The outputs of this run's producers, by number, while they live.
    made: BTreeMap<usize, WeakBuffer>,
}

/// A producer's number in the step and the wants recorded for it.
pub(crate) struct Producer {
    pub(crate) number: usize,
    pub(crate) wants: Vec<Want>,
}

impl Producer {
    /// The activation wanted of this producer's output (and whether its bf16 copy too).
    pub(crate) fn activation(&self) -> Option<(i32, bool)> {
        self.wants.iter().find_map(|w| match w {
            Want::Activation { code, bf16, .. } => Some((*code, *bf16)),
            _ => None,
        })
    }

    /// The LayerNorm wanted of this producer's output (and whether its bf16 copy too).
    pub(crate) fn layer_norm(&self) -> Option<(NormParams, bool)> {
        self.wants.iter().find_map(|w| match w {
            Want::LayerNorm { params, bf16, .. } => Some((params.clone(), *bf16)),
            _ => None,
        })
    }

    /// Whether the output's bf16 copy is wanted.
    pub(crate) fn bf16(&self) -> bool {
        self.wants.iter().any(|w| matches!(w, Want::Bf16))
    }

    /// The dropout wanted of this producer's output.
    pub(crate) fn dropout(&self) -> Option<DropoutSite> {
        self.wants.iter().find_map(|w| match w {
            Want::Dropout(site) => Some(site.clone()),
            _ => None,
        })
    }

    /// The cross-entropy wanted of this producer's output.
    pub(crate) fn cross_entropy(&self) -> Option<CrossEntropySite> {
        self.wants.iter().find_map(|w| match w {
            Want::CrossEntropy(site) => Some(*site),
            _ => None,
        })
    }

    /// The sum wanted of this producer's output and another producer's (its number), and the number of
    /// the add that wants it.
    pub(crate) fn residual(&self) -> Option<(usize, usize)> {
        self.wants.iter().find_map(|w| match w {
            Want::Residual { other, reader } => Some((*other, *reader)),
            _ => None,
        })
    }
}

impl Device {
    fn fusion(&self) -> std::sync::MutexGuard<'_, Fusion> {
        self.fusion.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the recording run before a capture of a step over `inputs` (unless `TEXTNET_FUSION=0` turns
    /// fusion off: the step is then captured as it runs op by op).
    pub(crate) fn fusion_record(&self, inputs: &[DeviceBuffer]) {
        let off = std::env::var_os("TEXTNET_FUSION").is_some_and(|v| v == "0");
        let phase = if off { Phase::Off } else { Phase::Recording };
        *self.fusion() = Fusion { phase, inputs: identities(inputs), ..Fusion::default() };
        self.fusing.store(!off, Ordering::Relaxed);
    }

    /// Ends a recording run: fusion is off, and the plan recorded is returned.
    pub(crate) fn fusion_end_recording(&self) -> Plan {
        self.fusion_end();
        Plan(std::mem::take(&mut self.fusion().recorded))
    }

    /// Starts a fused run (the last warm-up, or the capture) of a step over `inputs` by `plan`, each want
    /// that asks for a result asking for its bf16 copy too when the result's reader was asked for one.
    pub(crate) fn fusion_apply(&self, plan: &Plan, inputs: &[DeviceBuffer]) {
        let mut fusion = self.fusion();
        fusion.recorded = plan.0.clone();
        fusion.inputs = identities(inputs);
        let asked_bf16: Vec<bool> =
            fusion.recorded.iter().map(|(_, wants)| wants.iter().any(|w| matches!(w, Want::Bf16))).collect();
        for (_, wants) in &mut fusion.recorded {
            for want in wants {
                if let Want::Activation { reader, bf16, .. } | Want::LayerNorm { reader, bf16, .. } = want {
                    *bf16 = asked_bf16.get(*reader).copied().unwrap_or(false);
                }
            }
        }
        fusion.phase = Phase::Applying;
        fusion.next = 0;
        fusion.applied.clear();
        fusion.made.clear();
        self.fusing.store(true, Ordering::Relaxed);
    }

    /// Ends a fused run: fusion is off, and the fusions the run made are returned, each with how many
    /// times it was made.
    pub(crate) fn fusion_end(&self) -> Vec<(String, usize)> {
        let mut fusion = self.fusion();
        fusion.phase = Phase::Off;
        self.fusing.store(false, Ordering::Relaxed);
        std::mem::take(&mut fusion.applied).into_iter().collect()
    }

    /// The next producer of the step (None outside a recorded or fused run): `op` takes the next number,
    /// with the wants recorded for it when the recording had the same op there.
    pub(crate) fn producer(&self, op: &'static str) -> Option<Producer> {
        if !self.fusing.load(Ordering::Relaxed) {
            return None;
        }
        let mut fusion = self.fusion();
        let number = fusion.next;
        match fusion.phase {
            Phase::Off => None,
            Phase::Recording => {
                fusion.next += 1;
                fusion.recorded.push((op, Vec::new()));
                let draws = fusion.draws;
                fusion.draws_at.push(draws);
                Some(Producer { number, wants: Vec::new() })
            }
            Phase::Applying => {
                fusion.next += 1;
                let wants = match fusion.recorded.get(number) {
                    Some((recorded, wants)) if *recorded == op => wants.clone(),
                    _ => Vec::new(),
                };
                Some(Producer { number, wants })
            }
        }
    }

    /// Records, in a recording run, that a reader of `input` would take `want` from its producer.
    pub(crate) fn want(&self, input: &DeviceBuffer, want: Want) {
        if !self.fusing.load(Ordering::Relaxed) {
            return;
        }
        let mut fusion = self.fusion();
        if fusion.phase != Phase::Recording {
            return;
        }
        let Some(number) = input.made_by() else { return };
        if matches!(want, Want::Dropout(_)) && fusion.draws_at.get(number) != Some(&fusion.draws) {
            return;
        }
        if let Some((_, wants)) = fusion.recorded.get_mut(number) {
            let kind = std::mem::discriminant(&want);
            if !wants.iter().any(|w| std::mem::discriminant(w) == kind) {
                wants.push(want);
            }
        }
    }

    /// Which of the step's inputs `buffer` is, in a recording or fused run.
    pub(crate) fn step_input_of(&self, buffer: &DeviceBuffer) -> Option<usize> {
        if !self.fusing.load(Ordering::Relaxed) {
            return None;
        }
        self.fusion().inputs.iter().position(|&(identity, _)| identity == buffer.identity())
    }

    /// The output of this run's producer `number`, in a fused run, while it lives.
    pub(crate) fn made_output(self: &Arc<Self>, number: usize) -> Option<DeviceBuffer> {
        let fusion = self.fusion();
        (fusion.phase == Phase::Applying).then(|| fusion.made.get(&number)?.upgrade(self)).flatten()
    }

    /// The wants recorded for producer `number`, in a fused run.
    pub(crate) fn wants_of(&self, number: usize) -> Vec<Want> {
        let fusion = self.fusion();
        match (fusion.phase, fusion.recorded.get(number)) {
            (Phase::Applying, Some((_, wants))) => wants.clone(),
            _ => Vec::new(),
        }
    }

    /// The identity and address of the step's input `index`, in a fused run.
    pub(crate) fn step_input(&self, index: usize) -> Option<(usize, u64)> {
        let fusion = self.fusion();
        (fusion.phase == Phase::Applying).then(|| fusion.inputs.get(index).copied()).flatten()
    }

    /// Notes, in a recording run, that a mask was drawn on the device (a dropout's key, a step taken).
    pub(crate) fn drew_mask(&self) {
        if self.fusing.load(Ordering::Relaxed) {
            let mut fusion = self.fusion();
            if fusion.phase == Phase::Recording {
                fusion.draws += 1;
            }
        }
    }

    /// Whether a step is being recorded or fused now: the fusions then count (`fused`).
    pub(crate) fn is_fusing(&self) -> bool {
        self.fusing.load(Ordering::Relaxed)
    }

    /// Counts a fusion the capture made, described as `what`.
    pub(crate) fn fused(&self, what: String) {
        *self.fusion().applied.entry(what).or_default() += 1;
    }
}

impl DeviceBuffer {
    /// Marks this buffer as the output of producer `producer` (when there is one).
    pub(crate) fn made_by_producer(&self, producer: Option<&Producer>) {
        if let Some(p) = producer {
            self.block.fused().made_by = Some(p.number);
            self.device.fusion().made.insert(p.number, self.downgrade());
        }
    }

    /// The number of the producer that made this buffer in the current recording or capture.
    pub(crate) fn made_by(&self) -> Option<usize> {
        self.block.fused().made_by
    }

    /// Attaches a result computed for a reader of this buffer.
    pub(crate) fn attach(&self, extra: Extra) {
        self.block.fused().extras.push(extra);
    }

    /// The activation `code` of these elements and the op that computed it, when their producer did.
    pub(crate) fn activation_extra(&self, code: i32) -> Option<(DeviceBuffer, &'static str)> {
        self.block.fused().extras.iter().find_map(|e| match e {
            Extra::Activation { code: c, out, by } if *c == code => Some((out.clone(), *by)),
            _ => None,
        })
    }

    /// LayerNorm of these elements by `weight`, `bias`, ε `eps` over rows of `width` (y, μ, 1/σ), when
    /// their producer computed it.
    pub(crate) fn layer_norm_extra(
        &self,
        (weight, bias): (Option<&DeviceBuffer>, Option<&DeviceBuffer>),
        eps: f32,
        width: usize,
    ) -> Option<(DeviceBuffer, DeviceBuffer, DeviceBuffer)> {
        self.block.fused().extras.iter().find_map(|e| match e {
            Extra::LayerNorm { params, y, mean, rstd } if params.matches(weight, bias, eps, width) => {
                Some((y.clone(), mean.clone(), rstd.clone()))
            }
            _ => None,
        })
    }

    /// These elements dropped by `site`'s mask, and the step's key, when their producer computed them.
    pub(crate) fn dropout_extra(
        &self,
        step: &DeviceBuffer,
        site_seed: u32,
        (threshold, scale): (u32, f32),
    ) -> Option<(DeviceBuffer, DeviceBuffer)> {
        self.block.fused().extras.iter().find_map(|e| match e {
            Extra::Dropout { site, out, key } if site.matches(step, site_seed, threshold, scale) => {
                Some((out.clone(), key.clone()))
            }
            _ => None,
        })
    }

    /// The cross-entropy `site` of these elements against `targets`, when their producer computed that
    /// very one from those targets and nothing was written in place since.
    pub(crate) fn cross_entropy_extra(
        &self,
        targets: &DeviceBuffer,
        site: &CrossEntropySite,
    ) -> Option<CrossEntropyOut> {
        let writes_now = self.device.in_place_writes.load(Ordering::Relaxed);
        self.block.fused().extras.iter().find_map(|e| match e {
            Extra::CrossEntropy { site: made, targets: from, writes, out }
                if *from == targets.identity() && *writes == writes_now && made.same(site) =>
            {
                Some(out.clone())
            }
            _ => None,
        })
    }

    /// The sum of these elements and `other`'s and its ReLU, when their producer computed them and nothing
    /// was written in place since.
    pub(crate) fn residual_extra(&self, other: &DeviceBuffer) -> Option<(DeviceBuffer, DeviceBuffer)> {
        let writes_now = self.device.in_place_writes.load(Ordering::Relaxed);
        self.block.fused().extras.iter().find_map(|e| match e {
            Extra::Residual { other: with, writes, sum, activated } if with.is(other) && *writes == writes_now => {
                Some((sum.clone(), activated.clone()))
            }
            _ => None,
        })
    }

    /// The word holding 1 that the op making this scalar wrote for its backward's seed.
    pub(crate) fn seed_extra(&self) -> Option<DeviceBuffer> {
        self.block.fused().extras.iter().find_map(|e| match e {
            Extra::Seed(one) => Some(one.clone()),
            _ => None,
        })
    }

    /// The activation code and input these elements are the output of (its input while it lives).
    pub(crate) fn slope_extra(&self) -> Option<(i32, DeviceBuffer)> {
        let fused = self.block.fused();
        fused.extras.iter().find_map(|e| match e {
            Extra::Slope { code, input } => Some((*code, input.upgrade(&self.device)?)),
            _ => None,
        })
    }

    /// The bf16 copy of these elements, when their producer wrote it.
    pub(crate) fn bf16_extra(&self) -> Option<DeviceBuffer> {
        self.block.fused().extras.iter().find_map(|e| match e {
            Extra::Bf16(copy) => Some(copy.clone()),
            _ => None,
        })
    }
}

/// The identities and addresses of a step's inputs.
fn identities(inputs: &[DeviceBuffer]) -> Vec<(usize, u64)> {
    inputs.iter().map(|b| (b.identity(), b.address())).collect()
}

/// What fusion knows about one buffer: the producer that made it and the results attached to it.
#[derive(Default)]
pub(crate) struct Fused {
    made_by: Option<usize>,
    extras: Vec<Extra>,
}
