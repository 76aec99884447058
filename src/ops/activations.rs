//! The CPU twin of fused/activations.cuh: the hidden-layer activations the pipelines offer, with their
//! derivatives, and the Transformer's GELU (tanh form).

use super::constant;
use num_traits::Float;

/// The hidden-layer activations the pipelines offer, with their derivatives (the same math as
/// fused/activations.cuh): `Relu` max(0, z), `Sigmoid` 1 / (1 + e^−z) and `Tanh` tanh z.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// max(0, z)
    Relu,
    /// 1 / (1 + e^−z)
    Sigmoid,
    /// tanh z
    Tanh,
}

impl Activation {
    /// Every activation.
    pub const ALL: [Activation; 3] = [Activation::Relu, Activation::Sigmoid, Activation::Tanh];

    /// The name `--activation` and model files use: "relu", "sigmoid" or "tanh".
    pub fn name(self) -> &'static str {
        match self {
            Activation::Relu => "relu",
            Activation::Sigmoid => "sigmoid",
            Activation::Tanh => "tanh",
        }
    }

    /// The activation of that name, if any.
    pub fn from_name(name: &str) -> Option<Activation> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    #[inline]
    /// The activation of the pre-activation `z`.
    pub fn apply<F: Float>(self, z: F) -> F {
        match self {
            Activation::Relu => z.max(F::zero()),
            Activation::Sigmoid => F::one() / (F::one() + (-z).exp()),
            Activation::Tanh => z.tanh(),
        }
    }

    /// Its ACT_* code in fused/activations.cuh.
    pub fn kernel_code(self) -> i32 {
        match self {
            Activation::Relu => 0,
            Activation::Sigmoid => 1,
            Activation::Tanh => 2,
        }
    }

    /// act′(z), given z and a = act(z): ReLU reads z (0 at z = 0), sigmoid and tanh are cheapest from a.
    #[inline]
    pub fn derivative<F: Float>(self, z: F, a: F) -> F {
        match self {
            Activation::Relu => {
                if z > F::zero() {
                    F::one()
                } else {
                    F::zero()
                }
            }
            Activation::Sigmoid => a * (F::one() - a),
            Activation::Tanh => F::one() - a * a,
        }
    }
}

/// GELU, tanh form: 0.5·u·(1 + tanh(√(2/π)·(u + 0.044715·u³))).
pub fn gelu<F: Float>(u: F) -> F {
    let k: F = constant(std::f64::consts::FRAC_2_PI.sqrt());
    let half: F = constant(0.5);
    half * u * (F::one() + (k * (u + constant::<F>(0.044715) * u * u * u)).tanh())
}

/// d gelu(u) / du.
pub fn gelu_grad<F: Float>(u: F) -> F {
    let k: F = constant(std::f64::consts::FRAC_2_PI.sqrt());
    let (a, half): (F, F) = (constant(0.044715), constant(0.5));
    let th = (k * (u + a * u * u * u)).tanh();
    half * (F::one() + th) + half * u * (F::one() - th * th) * k * (F::one() + constant::<F>(3.0) * a * u * u)
}
