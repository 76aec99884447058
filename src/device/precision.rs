//! `--precision`: the arithmetic of a GPU trainer's matrix products. The CPU twins always compute in
//! fp32 (or f64 in the gradient checks); what each precision costs in accuracy is measured against them.

/// The `--precision` flag.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// fp32 throughout, on the CUDA cores
    #[default]
    Fp32,
    /// Products on the tensor cores in TF32 (operands rounded to a 10-bit mantissa, fp32 sums)
    Tf32,
    /// Products on the tensor cores in bf16 (operands rounded to an 8-bit mantissa, fp32 sums; fp32
    /// master weights, optimizer state, LayerNorm and softmax statistics), as PyTorch's bf16 autocast
    Bf16,
}

impl Precision {
    /// The flag value, e.g. "bf16".
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
        }
    }

    /// Relative rounding of one operand of a product (half an ulp of its significand: 24, 11 and 8 bits):
    /// 2⁻²⁴ (fp32), 2⁻¹¹ (TF32), 2⁻⁸ (bf16).
    pub fn unit_roundoff(self) -> f64 {
        match self {
            Precision::Fp32 => f64::powi(2.0, -24),
            Precision::Tf32 => f64::powi(2.0, -11),
            Precision::Bf16 => f64::powi(2.0, -8),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn flag_values_are_the_names() {
        for p in Precision::value_variants() {
            assert_eq!(p.to_possible_value().unwrap().get_name(), p.name());
        }
    }
}
