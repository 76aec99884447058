//! The parameters of a two-layer perceptron (`w1` [hidden, inputs], `b1`, `w2` [outputs, hidden], `b2`,
//! PyTorch's `nn.Linear` layouts) as views of one flat vector: the layout the MNIST MLP and the sales
//! regressor keep their parameters in, in memory and in their model files.

/// The four parameter tensors (or their gradients, or optimizer state) as views of one flat vector.
pub struct Parts<T> {
    /// Hidden weights, `[hidden][inputs]` row-major.
    pub w1: T,
    /// Hidden biases, `[hidden]`.
    pub b1: T,
    /// Output weights, `[outputs][hidden]` row-major.
    pub w2: T,
    /// Output biases, `[outputs]`.
    pub b2: T,
}

/// Length of the flat vector of a perceptron of these sizes.
pub fn param_count(inputs: usize, hidden: usize, outputs: usize) -> usize {
    hidden * inputs + hidden + outputs * hidden + outputs
}

impl<'a> Parts<&'a [f32]> {
    /// `flat` cut into the four tensors; it must hold exactly `param_count` floats.
    pub fn of(flat: &'a [f32], inputs: usize, hidden: usize, outputs: usize) -> Self {
        assert_eq!(flat.len(), param_count(inputs, hidden, outputs), "flat buffer does not match the model shape");
        let (w1, rest) = flat.split_at(hidden * inputs);
        let (b1, rest) = rest.split_at(hidden);
        let (w2, b2) = rest.split_at(outputs * hidden);
        Parts { w1, b1, w2, b2 }
    }
}

impl<'a> Parts<&'a mut [f32]> {
    /// `flat` cut into the four tensors, writable.
    pub fn of_mut(flat: &'a mut [f32], inputs: usize, hidden: usize, outputs: usize) -> Self {
        assert_eq!(flat.len(), param_count(inputs, hidden, outputs), "flat buffer does not match the model shape");
        let (w1, rest) = flat.split_at_mut(hidden * inputs);
        let (b1, rest) = rest.split_at_mut(hidden);
        let (w2, b2) = rest.split_at_mut(outputs * hidden);
        Parts { w1, b1, w2, b2 }
    }
}
