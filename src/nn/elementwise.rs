//! Elementwise ops: `add`, `sub`, `mul`, `div` with NumPy broadcasting (and their scalar forms, which
//! broadcast a tensor of shape `[]`), and the unary maps `relu`, `gelu`, `tanh`, `sigmoid`, `exp`, `log`,
//! `neg`. The activations' math and derivatives are `ops::activations`', the twins of the kernels'.
//!
//! A broadcast operand's gradient is the output's gradient summed over the axes it was broadcast along:
//! each element adds into its operand's element in the output's row-major order, a fixed order.

use super::cuda::{self, Place, ops as device};
use super::error::{Error, Result};
use super::shape::{broadcast_shape, broadcast_strides, for_each_offset};
use super::tensor::{Storage, Tensor};
use crate::ops::activations::{Activation, gelu, gelu_grad};
use crate::ops::cpu::Real;
use std::sync::Arc;

#[derive(Clone, Copy, Debug)]
enum Binary {
    Add,
    Sub,
    Mul,
    Div,
}

impl Binary {
    /// The kernel's code (OP_* of fused/nn.cu).
    fn code(self) -> i32 {
        match self {
            Binary::Add => device::OP_ADD,
            Binary::Sub => device::OP_SUB,
            Binary::Mul => device::OP_MUL,
            Binary::Div => device::OP_DIV,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Binary::Add => "add",
            Binary::Sub => "sub",
            Binary::Mul => "mul",
            Binary::Div => "div",
        }
    }

    fn apply<F: Real>(self, a: F, b: F) -> F {
        match self {
            Binary::Add => a + b,
            Binary::Sub => a - b,
            Binary::Mul => a * b,
            Binary::Div => a / b,
        }
    }

    /// (∂(a op b)/∂a, ∂(a op b)/∂b).
    fn partials<F: Real>(self, a: F, b: F) -> (F, F) {
        match self {
            Binary::Add => (F::one(), F::one()),
            Binary::Sub => (F::one(), -F::one()),
            Binary::Mul => (b, a),
            Binary::Div => (F::one() / b, -a / (b * b)),
        }
    }
}

fn binary<F: Real>(op: Binary, a: &Tensor<F>, b: &Tensor<F>) -> Result<Tensor<F>> {
    let shape = broadcast_shape(a.shape(), b.shape())
        .ok_or_else(|| Error::shapes(op.name(), a.shape(), b.shape(), "do not broadcast"))?;
    if let Place::Device(gpu) = cuda::place_of(op.name(), &[a, b])? {
        return device::binary(&gpu, op.name(), op.code(), (a, b), shape);
    }
    let (strides_a, strides_b) = (broadcast_strides(a.shape(), &shape), broadcast_strides(b.shape(), &shape));
    let (values_a, values_b) = (a.storage(), b.storage());
    let mut out = vec![F::zero(); shape.iter().product()];
    let (x, y) = (values_a.host(), values_b.host());
    for_each_offset(&shape, [&strides_a, &strides_b], |i, [ia, ib]| out[i] = op.apply(x[ia], y[ib]));
    let (count_a, count_b, out_shape) = (a.numel(), b.numel(), shape.clone());
    let backward = move |grad: &[F], needs: &[bool]| {
        let (x, y) = (values_a.host(), values_b.host());
        let mut grad_a = needs[0].then(|| vec![F::zero(); count_a]);
        let mut grad_b = needs[1].then(|| vec![F::zero(); count_b]);
        for_each_offset(&out_shape, [&strides_a, &strides_b], |i, [ia, ib]| {
            let (da, db) = op.partials(x[ia], y[ib]);
            if let Some(grad_a) = grad_a.as_mut() {
                grad_a[ia] = grad_a[ia] + grad[i] * da;
            }
            if let Some(grad_b) = grad_b.as_mut() {
                grad_b[ib] = grad_b[ib] + grad[i] * db;
            }
        });
        Ok(vec![grad_a, grad_b])
    };
    Ok(Tensor::from_op(op.name(), Arc::new(Storage::Host(out)), shape, &[a, b], Box::new(backward)))
}

#[derive(Clone, Copy, Debug)]
enum Unary {
    Activation(Activation),
    Gelu,
    Exp,
    Log,
    Neg,
}

impl Unary {
    /// The kernel's code (UNARY_* of fused/nn.cu).
    fn code(self) -> i32 {
        match self {
            Unary::Activation(Activation::Relu) => device::UNARY_RELU,
            Unary::Activation(Activation::Sigmoid) => device::UNARY_SIGMOID,
            Unary::Activation(Activation::Tanh) => device::UNARY_TANH,
            Unary::Gelu => device::UNARY_GELU,
            Unary::Exp => device::UNARY_EXP,
            Unary::Log => device::UNARY_LOG,
            Unary::Neg => device::UNARY_NEG,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Unary::Activation(activation) => activation.name(),
            Unary::Gelu => "gelu",
            Unary::Exp => "exp",
            Unary::Log => "log",
            Unary::Neg => "neg",
        }
    }

    fn apply<F: Real>(self, x: F) -> F {
        match self {
            Unary::Activation(activation) => activation.apply(x),
            Unary::Gelu => gelu(x),
            Unary::Exp => x.exp(),
            Unary::Log => x.ln(),
            Unary::Neg => -x,
        }
    }

    /// d y / d x at x, where y is the output there.
    fn derivative<F: Real>(self, x: F, y: F) -> F {
        match self {
            Unary::Activation(activation) => activation.derivative(x, y),
            Unary::Gelu => gelu_grad(x),
            Unary::Exp => y,
            Unary::Log => F::one() / x,
            Unary::Neg => -F::one(),
        }
    }
}

fn unary<F: Real>(op: Unary, x: &Tensor<F>) -> Result<Tensor<F>> {
    if let Place::Device(gpu) = cuda::place_of(op.name(), &[x])? {
        return device::unary(&gpu, op.name(), op.code(), x);
    }
    let input = x.storage();
    let output = Arc::new(Storage::Host(input.host().iter().map(|&v| op.apply(v)).collect()));
    let saved_output = Arc::clone(&output);
    let backward = move |grad: &[F], _needs: &[bool]| {
        let pairs = input.host().iter().zip(saved_output.host());
        Ok(vec![Some(pairs.zip(grad).map(|((&x, &y), &g)| g * op.derivative(x, y)).collect())])
    };
    Ok(Tensor::from_op(op.name(), output, x.shape().to_vec(), &[x], Box::new(backward)))
}

impl<F: Real> Tensor<F> {
    /// `self + other`, broadcast.
    pub fn add(&self, other: &Tensor<F>) -> Result<Tensor<F>> {
        binary(Binary::Add, self, other)
    }

    /// `self − other`, broadcast.
    pub fn sub(&self, other: &Tensor<F>) -> Result<Tensor<F>> {
        binary(Binary::Sub, self, other)
    }

    /// `self · other` elementwise, broadcast.
    pub fn mul(&self, other: &Tensor<F>) -> Result<Tensor<F>> {
        binary(Binary::Mul, self, other)
    }

    /// `self / other` elementwise, broadcast.
    pub fn div(&self, other: &Tensor<F>) -> Result<Tensor<F>> {
        binary(Binary::Div, self, other)
    }

    /// `self + value`.
    pub fn add_scalar(&self, value: F) -> Result<Tensor<F>> {
        self.scalar_op(Binary::Add, value)
    }

    /// `self − value`.
    pub fn sub_scalar(&self, value: F) -> Result<Tensor<F>> {
        self.scalar_op(Binary::Sub, value)
    }

    /// `self · value`.
    pub fn mul_scalar(&self, value: F) -> Result<Tensor<F>> {
        self.scalar_op(Binary::Mul, value)
    }

    /// `self / value`.
    pub fn div_scalar(&self, value: F) -> Result<Tensor<F>> {
        self.scalar_op(Binary::Div, value)
    }

    fn scalar_op(&self, op: Binary, value: F) -> Result<Tensor<F>> {
        if let Place::Device(gpu) = cuda::place_of(op.name(), &[self])? {
            return device::scalar(&gpu, op.name(), op.code(), self, value.to_f32().unwrap_or(f32::NAN), false);
        }
        binary(op, self, &Tensor::scalar(value))
    }

    /// max(0, x).
    pub fn relu(&self) -> Result<Tensor<F>> {
        unary(Unary::Activation(Activation::Relu), self)
    }

    /// GELU, tanh form.
    pub fn gelu(&self) -> Result<Tensor<F>> {
        unary(Unary::Gelu, self)
    }

    /// tanh x.
    pub fn tanh(&self) -> Result<Tensor<F>> {
        unary(Unary::Activation(Activation::Tanh), self)
    }

    /// 1 / (1 + e^−x).
    pub fn sigmoid(&self) -> Result<Tensor<F>> {
        unary(Unary::Activation(Activation::Sigmoid), self)
    }

    /// e^x.
    pub fn exp(&self) -> Result<Tensor<F>> {
        unary(Unary::Exp, self)
    }

    /// ln x (NaN below 0, −∞ at 0, as PyTorch's).
    pub fn log(&self) -> Result<Tensor<F>> {
        unary(Unary::Log, self)
    }

    /// −x.
    pub fn neg(&self) -> Result<Tensor<F>> {
        unary(Unary::Neg, self)
    }
}
