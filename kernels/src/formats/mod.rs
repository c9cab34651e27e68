//! Bit-exact weight formats (docs/DESIGN.md §3.3). Each codec is pure and total: every input has a
//! defined output, and the policy for out-of-range values is stated beside the function.

pub mod bf16;
pub mod e4m3;
pub mod nvfp4;

pub use bf16::{bf16_from_f32, bf16_to_f32};
pub use e4m3::{
    e4m3_block_dequant, e4m3_block_quantize, e4m3_block_quantize_into, e4m3_decode, e4m3_encode,
    e4m3_encode_branchless, ue4m3_decode, ue4m3_encode, E4M3_MAX, E4M3_NAN,
};
pub use nvfp4::{e2m1_decode, e2m1_encode, Nvfp4Matrix, NVFP4_GROUP};

/// Side of the square scale block of a block-scaled E4M3 matrix.
pub const E4M3_BLOCK: usize = 128;
