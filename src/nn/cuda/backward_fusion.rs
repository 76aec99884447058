//! The backward's fusions, eager or captured alike: an activation whose one reader is a linear
//! layer (fp32), or a ReLU whose one reader is a convolution whose input gradient is direct or a max pool,
//! gets its input's gradient from that layer's backward, which multiplies dx by the activation's slope in its
//! epilogue (`nn_linear_grad`'s `act_pre`, the window walks' `WindowEpilogue`, `nn_max_pool_grad`'s
//! `relu_out`), and the activation's own backward does not launch. The autograd walk, which alone knows
//! that the layer is the activation's one reader, offers it ([`Device::offer_slope`]); the layer's backward
//! takes it or not ([`Device::take_slope`]); the walk then sends the gradient on to the activation's input
//! ([`Device::slope_taken`]). The expression is `nn_unary_grad`'s, so the bits are the same as the two
//! launches'. Likewise, where a direct convolution is the last reader of its input to send it a gradient,
//! the gradient the input has from its other readers (a residual block's skip) is offered
//! ([`Device::offer_addend`]): the input gradient's epilogue adds it (`nn_binary`'s sum), and then the
//! slope of the ReLU that made the input may be taken though that ReLU has two readers, the gradient being
//! whole there. `TEXTNET_FUSION=0` turns both off.

use super::{Device, DeviceBuffer};
use std::sync::atomic::Ordering;

/// The activation whose slope the autograd walk offers to the backward about to run (see the module's
/// text): its output, whether the slope may be taken only with the addend offered beside it (the output's
/// other readers' gradient), and whether that backward took it.
pub(crate) struct SlopeOffer {
    output: DeviceBuffer,
    with_addend: bool,
    taken: bool,
}

/// The gradient that the input of the backward about to run has already from its other readers, offered to
/// be added in that backward's epilogue (see the module's text): the input, the gradient, and whether the
/// backward took it.
pub(crate) struct AddendOffer {
    input: DeviceBuffer,
    grad: DeviceBuffer,
    taken: bool,
}

impl Device {
    /// Offers the slope of the activation that made `output` to the backward about to run (unless
    /// `TEXTNET_FUSION=0`); true when `output` is such an activation's. `with_addend`: the slope may be taken
    /// only together with the addend offered (`offer_addend`), which completes `output`'s gradient.
    pub(crate) fn offer_slope(&self, output: &DeviceBuffer, with_addend: bool) -> bool {
        if !self.backward_fusion.load(Ordering::Relaxed) || output.slope_extra().is_none() {
            return false;
        }
        *self.slope_offer.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(SlopeOffer { output: output.clone(), with_addend, taken: false });
        true
    }

    /// Offers `grad`, what `input` has already from its other readers, to the backward about to run (its
    /// last reader), to be added to the gradient it forms for `input` (unless `TEXTNET_FUSION=0`).
    pub(crate) fn offer_addend(&self, input: &DeviceBuffer, grad: &DeviceBuffer) -> bool {
        if !self.backward_fusion.load(Ordering::Relaxed) {
            return false;
        }
        *self.addend_offer.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(AddendOffer { input: input.clone(), grad: grad.clone(), taken: false });
        true
    }

    /// For a backward reading `input`: the gradient offered to be added to `input`'s, marked as taken. The
    /// caller then returns the sum as `input`'s gradient, the addend in it.
    pub(crate) fn take_addend(&self, op: &'static str, input: &DeviceBuffer) -> Option<DeviceBuffer> {
        let mut offer = self.addend_offer.lock().unwrap_or_else(|p| p.into_inner());
        let offered = offer.as_mut().filter(|o| o.input.same_elements(input))?;
        offered.taken = true;
        let grad = offered.grad.clone();
        self.addends_taken.fetch_add(1, Ordering::Relaxed);
        if self.fusing.load(Ordering::Relaxed) {
            drop(offer);
            self.fused(format!("{op} ← the input's other gradient: added in dx's epilogue, no launch of the sum"));
        }
        Some(grad)
    }

    /// Ends an addend offer: whether the backward took it.
    pub(crate) fn addend_taken(&self) -> bool {
        self.addend_offer.lock().unwrap_or_else(|p| p.into_inner()).take().is_some_and(|o| o.taken)
    }

    /// How many addends backward passes on this device have taken so far.
    pub(crate) fn addends_taken(&self) -> usize {
        self.addends_taken.load(Ordering::Relaxed)
    }

    /// For a backward reading `input`: the offered activation's code and input when `input` is its output
    /// and the backward can fuse that code (`fuses`), marked as taken. The caller then returns the
    /// gradient of the activation's input in place of `input`'s.
    pub(crate) fn take_slope(
        &self,
        op: &'static str,
        input: &DeviceBuffer,
        fuses: impl Fn(i32) -> bool,
    ) -> Option<(i32, DeviceBuffer)> {
        let mut offer = self.slope_offer.lock().unwrap_or_else(|p| p.into_inner());
        let offered = offer.as_mut().filter(|o| o.output.same_elements(input))?;
        let addend_taken =
            || self.addend_offer.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|o| o.taken);
        if offered.with_addend && !addend_taken() {
            return None;
        }
        let (code, of) = input.slope_extra().filter(|&(code, _)| fuses(code))?;
        offered.taken = true;
        self.slopes_taken.fetch_add(1, Ordering::Relaxed);
        if self.fusing.load(Ordering::Relaxed) {
            drop(offer);
            self.fused(format!("{op} ← activation: its slope in dx's epilogue, no launch of its backward"));
        }
        Some((code, of))
    }

    /// Turns the backward's fusion on or off (a check compares the two).
    pub(crate) fn set_backward_fusion(&self, on: bool) {
        self.backward_fusion.store(on, Ordering::Relaxed);
    }

    /// How many activation slopes backward passes on this device have taken so far.
    pub(crate) fn slopes_taken(&self) -> usize {
        self.slopes_taken.load(Ordering::Relaxed)
    }

    /// Ends an offer: whether the backward took it.
    pub(crate) fn slope_taken(&self) -> bool {
        self.slope_offer.lock().unwrap_or_else(|p| p.into_inner()).take().is_some_and(|o| o.taken)
    }
}
