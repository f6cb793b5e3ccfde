//! The linear layers on cuBLASLt (the device's `matmul`): forward, input and weight
//! gradients, the bias as rank-1 GEMMs, and the fused projection's split and merge as 2-D
//! copies.

mod op;
