//! The seam digest (docs/DESIGN.md §5): order-independent so any reduction order on a device gives
//! the host's value: the wrapping u64 sum over elements of `splitmix64((index << 32) | bits)`
//! where `index` is the element's GLOBAL index in the logical seam tensor (< 2^32) and `bits`
//! its 32-bit pattern (f32 bits, or a u32 id). Shards digest with their global offset and the
//! rank digests add (wrapping) to the digest of the whole tensor.

/// splitmix64 finalizer.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Digest of f32 values whose first element has global index `base`.
pub fn digest_f32(x: &[f32], base: u64) -> u64 {
    x.iter()
        .enumerate()
        .fold(0u64, |acc, (i, v)| acc.wrapping_add(splitmix64(((base + i as u64) << 32) | v.to_bits() as u64)))
}

/// Digest of u32 words whose first element has global index `base`.
pub fn digest_u32(x: &[u32], base: u64) -> u64 {
    x.iter().enumerate().fold(0u64, |acc, (i, v)| acc.wrapping_add(splitmix64(((base + i as u64) << 32) | *v as u64)))
}

/// One part of a batched seam digest (`digest_batch_f32`): `blocks` blocks of `x` (each
/// `block_len` values, block i starting `pitch` values after block i−1), block i with the global
/// base `base + i·base_pitch`. The digest of the part is the wrapping sum of its blocks' digests:
/// the same value as one `digest_f32` per block, summed, so batching changes launches, never a
/// digest.
pub fn digest_blocks(x: &[f32], block_len: usize, blocks: usize, pitch: usize, base: u64, base_pitch: u64) -> u64 {
    (0..blocks).fold(0u64, |acc, i| {
        let start = i * pitch;
        acc.wrapping_add(digest_f32(&x[start..start + block_len], base + i as u64 * base_pitch))
    })
}
