//! Facts of the canonical grid and of f32 bit patterns that every crate shares: the TP sizes the
//! grid admits, and the ULP distance used wherever two results are compared (gates, receipts,
//! tests). One definition each, so the harness cannot disagree with itself about them.

/// Blocks of the canonical grid every projection is computed on (docs/DESIGN.md §3.4).
pub const GRID_BLOCKS: usize = 8;

/// TP sizes the canonical grid admits: the divisors of [`GRID_BLOCKS`].
pub const TP_SIZES: [usize; 4] = [1, 2, 4, 8];

/// Whether `tp` divides the canonical grid.
pub fn is_tp_size(tp: usize) -> bool {
    TP_SIZES.contains(&tp)
}

/// A tensor-parallel size: 1, 2, 4 or 8 and nothing else (a divisor of [`GRID_BLOCKS`]). Made
/// once, where a size enters (a flag, a file, a constructor), with [`Tp::new`]; code that holds
/// a `Tp` never checks it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tp(u8);

impl Tp {
    /// `n` as a TP size, or the error that says which sizes exist.
    pub fn new(n: usize) -> Result<Tp, NotATpSize> {
        if is_tp_size(n) {
            Ok(Tp(n as u8))
        } else {
            Err(NotATpSize(n))
        }
    }

    /// The size as a count of ranks.
    pub fn get(self) -> usize {
        usize::from(self.0)
    }
}

impl std::fmt::Display for Tp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl TryFrom<usize> for Tp {
    type Error = NotATpSize;
    fn try_from(n: usize) -> Result<Tp, NotATpSize> {
        Tp::new(n)
    }
}

/// A number that is not a TP size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotATpSize(pub usize);

impl std::fmt::Display for NotATpSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TP size {} is not supported (rule: TP must divide the canonical grid of {GRID_BLOCKS} blocks: 1, 2, 4 or 8)",
            self.0
        )
    }
}

impl std::error::Error for NotATpSize {}

/// ULP distance between two f32 bit patterns: the number of steps between them on the monotone
/// integer line of f32 values (so `-0.0` and `+0.0` are 1 apart, never 0). Equal bit patterns are
/// 0 apart; otherwise a NaN on either side has no distance: `u64::MAX`.
pub fn ulp_distance(a: u32, b: u32) -> u64 {
    if a == b {
        return 0;
    }
    if f32::from_bits(a).is_nan() || f32::from_bits(b).is_nan() {
        return u64::MAX;
    }
    fn key(bits: u32) -> i64 {
        if bits & 0x8000_0000 != 0 {
            -i64::from(bits & 0x7fff_ffff) - 1
        } else {
            i64::from(bits)
        }
    }
    key(a).abs_diff(key(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tp_holds_the_grid_sizes_only() {
        for n in 0..=16 {
            match Tp::new(n) {
                Ok(tp) => assert!(TP_SIZES.contains(&n) && tp.get() == n, "{n}"),
                Err(e) => {
                    assert!(!TP_SIZES.contains(&n), "{n} refused");
                    assert!(e.to_string().contains(&format!("TP size {n} is not supported")), "{e}");
                }
            }
        }
    }

    #[test]
    fn ulp_distance_counts_representable_values_and_refuses_nan() {
        assert_eq!(ulp_distance(1.0f32.to_bits(), 1.0f32.to_bits()), 0);
        assert_eq!(ulp_distance(1.0f32.to_bits(), 0x3f80_0001), 1);
        assert_eq!(ulp_distance((-0.0f32).to_bits(), 0.0f32.to_bits()), 1);
        assert_eq!(ulp_distance(1, 0x8000_0001), 3);
        assert_eq!(ulp_distance(f32::NAN.to_bits(), 1.0f32.to_bits()), u64::MAX);
        assert_eq!(ulp_distance(f32::NAN.to_bits(), f32::NAN.to_bits()), 0, "identical bits are never apart");
        assert_eq!(ulp_distance(f32::INFINITY.to_bits(), f32::MAX.to_bits()), 1);
    }

    #[test]
    fn tp_sizes_are_the_divisors_of_the_grid() {
        let divisors: Vec<usize> = (1..=GRID_BLOCKS).filter(|d| GRID_BLOCKS.is_multiple_of(*d)).collect();
        assert_eq!(divisors, TP_SIZES);
    }
}
