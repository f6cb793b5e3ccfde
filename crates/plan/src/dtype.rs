//! Element types of the tensors a Plan describes and a backend holds.

/// Element type of a device tensor.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum DType {
    /// IEEE single precision: master weights, gradients, optimizer states, the fp32 recipe.
    #[default]
    F32,
    /// bfloat16 (8-bit exponent, 7-bit mantissa): activations and weight copies of the
    /// mixed-precision recipe.
    Bf16,
    /// One byte: the dropout masks kept from forward to backward (0 or 1).
    U8,
}

impl DType {
    /// Bytes per element.
    pub fn size_bytes(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::Bf16 => 2,
            DType::U8 => 1,
        }
    }
}
