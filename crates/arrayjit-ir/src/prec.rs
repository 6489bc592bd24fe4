//! Numeric precisions (`Prec`): byte sizes, C type names, conversions and neutral elements.

use std::fmt;

/// The element type of a tensor node or host array.
///
/// Half-precision types (`F16`, `Bf16`) are stored as 16 bits and computed in `f32`, like on most
/// hardware; integer types compute with wrapping arithmetic (see [`crate::ops`] for the exact rules).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Prec {
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 16-bit integer.
    U16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
    /// IEEE 754 half precision.
    F16,
    /// Brain floating point (8-bit exponent, 7-bit mantissa).
    Bf16,
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 double precision.
    F64,
}

impl Prec {
    /// Every precision, smallest integer types first.
    pub const ALL: [Prec; 10] = [
        Prec::U8,
        Prec::U16,
        Prec::I32,
        Prec::U32,
        Prec::I64,
        Prec::U64,
        Prec::F16,
        Prec::Bf16,
        Prec::F32,
        Prec::F64,
    ];

    /// Size of one element in bytes.
    pub fn size_in_bytes(self) -> usize {
        match self {
            Prec::U8 => 1,
            Prec::U16 | Prec::F16 | Prec::Bf16 => 2,
            Prec::I32 | Prec::U32 | Prec::F32 => 4,
            Prec::I64 | Prec::U64 | Prec::F64 => 8,
        }
    }

    /// Short lowercase name, as accepted by [`Prec::parse`].
    pub fn name(self) -> &'static str {
        match self {
            Prec::U8 => "u8",
            Prec::U16 => "u16",
            Prec::I32 => "i32",
            Prec::U32 => "u32",
            Prec::I64 => "i64",
            Prec::U64 => "u64",
            Prec::F16 => "f16",
            Prec::Bf16 => "bf16",
            Prec::F32 => "f32",
            Prec::F64 => "f64",
        }
    }

    /// Parses a name such as `"f32"` or `"bf16"` (an [`UnknownPrecision`], which converts to
    /// `Error::InvalidArgument`, for any other).
    pub fn parse(name: &str) -> std::result::Result<Prec, UnknownPrecision> {
        Prec::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| UnknownPrecision(name.to_string()))
    }

    /// Whether this is a floating-point type (including the 16-bit ones).
    pub fn is_float(self) -> bool {
        matches!(self, Prec::F16 | Prec::Bf16 | Prec::F32 | Prec::F64)
    }

    /// Whether this is an integer type.
    pub fn is_integer(self) -> bool {
        !self.is_float()
    }

    /// Whether this is a signed integer type.
    pub fn is_signed_integer(self) -> bool {
        matches!(self, Prec::I32 | Prec::I64)
    }

    /// The precision arithmetic on values of this type is carried out in: `f32` for the 16-bit
    /// floats, the type itself otherwise.
    pub fn compute_prec(self) -> Prec {
        match self {
            Prec::F16 | Prec::Bf16 => Prec::F32,
            p => p,
        }
    }

    /// The smallest representable value (negative infinity for floats).
    pub fn min_value(self) -> f64 {
        match self {
            Prec::U8 | Prec::U16 | Prec::U32 | Prec::U64 => 0.0,
            Prec::I32 => i32::MIN as f64,
            Prec::I64 => i64::MIN as f64,
            _ => f64::NEG_INFINITY,
        }
    }

    /// The largest representable value (positive infinity for floats).
    pub fn max_value(self) -> f64 {
        match self {
            Prec::U8 => u8::MAX as f64,
            Prec::U16 => u16::MAX as f64,
            Prec::U32 => u32::MAX as f64,
            Prec::U64 => u64::MAX as f64,
            Prec::I32 => i32::MAX as f64,
            Prec::I64 => i64::MAX as f64,
            _ => f64::INFINITY,
        }
    }

    /// Rounds an `f64` to the nearest value of this precision, the way storing it would: floats
    /// round to nearest even, integers truncate toward zero and saturate, NaN becomes 0.
    pub fn round_value(self, x: f64) -> f64 {
        match self {
            Prec::U8 => x as u8 as f64,
            Prec::U16 => x as u16 as f64,
            Prec::I32 => x as i32 as f64,
            Prec::U32 => x as u32 as f64,
            Prec::I64 => x as i64 as f64,
            Prec::U64 => x as u64 as f64,
            Prec::F16 => half::f16::from_f64(x).to_f64(),
            Prec::Bf16 => half::bf16::from_f64(x).to_f64(),
            Prec::F32 => x as f32 as f64,
            Prec::F64 => x,
        }
    }

    /// The wider of two precisions for mixing them in one computation: floats win over integers,
    /// then the larger size wins.
    pub fn promote(self, other: Prec) -> Prec {
        let rank = |p: Prec| (p.is_float(), p.size_in_bytes(), p == Prec::Bf16);
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

/// A name that is no precision's (from [`Prec::parse`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownPrecision(pub String);

impl fmt::Display for UnknownPrecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown precision {:?}; expected one of: {}",
            self.0,
            Prec::ALL.map(Prec::name).join(", ")
        )
    }
}

impl std::error::Error for UnknownPrecision {}

impl fmt::Display for Prec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes() {
        for p in Prec::ALL {
            assert_eq!(Prec::parse(p.name()).unwrap(), p);
        }
        assert_eq!(Prec::Bf16.size_in_bytes(), 2);
        assert_eq!(Prec::U64.size_in_bytes(), 8);
        assert!(Prec::parse("f128").is_err());
    }

    #[test]
    fn rounding_saturates_and_rounds_to_nearest_even() {
        assert_eq!(Prec::U8.round_value(300.0), 255.0);
        assert_eq!(Prec::U8.round_value(-3.0), 0.0);
        assert_eq!(Prec::I32.round_value(f64::NAN), 0.0);
        assert_eq!(Prec::I32.round_value(-2.7), -2.0);
        assert_eq!(Prec::F16.round_value(1.0 + 1.0 / 4096.0), 1.0);
        assert_eq!(Prec::F32.round_value(0.1), 0.1f32 as f64);
    }

    #[test]
    fn promotion_prefers_floats_then_width() {
        assert_eq!(Prec::I64.promote(Prec::F16), Prec::F16);
        assert_eq!(Prec::F32.promote(Prec::F64), Prec::F64);
        assert_eq!(Prec::U8.promote(Prec::I32), Prec::I32);
    }
}
