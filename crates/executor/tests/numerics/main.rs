//! The executor's numerics on the CPU against independent references: collectives, gradients, LoRA, Philox in C.

mod collectives;
mod gradcheck;
mod lora_gradcheck;
mod philox_c;
