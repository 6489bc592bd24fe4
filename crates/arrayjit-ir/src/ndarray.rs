//! Host arrays (`Ndarray`): typed storage for every precision, dims, optional padding, element
//! access, bulk conversion and readable printing.

use std::fmt;

use half::{bf16, f16};

use crate::error::{Error, OutOfBounds, RangeUnit, Result};
use crate::prec::Prec;

mod fill;

/// Padding of one axis: how many elements sit before and after the logical data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AxisPadding {
    /// Elements before index 0.
    pub left: usize,
    /// Elements after the last logical index.
    pub right: usize,
}

/// Padding of a whole array: one [`AxisPadding`] per axis and the value stored in the margins.
#[derive(Clone, Debug, PartialEq)]
pub struct Padding {
    /// Per-axis padding; its length equals the number of axes.
    pub axes: Vec<AxisPadding>,
    /// The value the margins hold.
    pub value: f64,
}

impl Padding {
    /// The padded dims of logical `dims`: an error when the padding has another number of
    /// axes, or a padded dim or the total element count does not fit in memory (`isize::MAX`).
    pub fn padded_dims(&self, dims: &[usize]) -> Result<Vec<usize>> {
        if self.axes.len() != dims.len() {
            return Err(Error::ShapeMismatch {
                op: "padding".into(),
                shapes: vec![],
                detail: format!(
                    "padding has {} axes but dims {dims:?} have {}",
                    self.axes.len(),
                    dims.len()
                ),
            });
        }
        let too_big = || Error::OutOfMemory {
            what: format!("an array of dims {dims:?} with padding {:?}", self.axes),
            bytes: usize::MAX,
        };
        let padded: Vec<usize> = dims
            .iter()
            .zip(&self.axes)
            .map(|(d, p)| d.checked_add(p.left)?.checked_add(p.right))
            .collect::<Option<_>>()
            .ok_or_else(too_big)?;
        let total = padded.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if total.is_none_or(|n| n > isize::MAX as usize) {
            return Err(too_big());
        }
        Ok(padded)
    }
}

/// Typed element storage, one variant per [`Prec`].
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Storage {
    U8(Vec<u8>),
    U16(Vec<u16>),
    I32(Vec<i32>),
    U32(Vec<u32>),
    I64(Vec<i64>),
    U64(Vec<u64>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// Runs `$body` with `$v` bound to the storage's vector, whatever its element type.
macro_rules! with_storage {
    ($s:expr, $v:ident => $body:expr) => {
        match $s {
            Storage::U8($v) => $body,
            Storage::U16($v) => $body,
            Storage::I32($v) => $body,
            Storage::U32($v) => $body,
            Storage::I64($v) => $body,
            Storage::U64($v) => $body,
            Storage::F16($v) => $body,
            Storage::Bf16($v) => $body,
            Storage::F32($v) => $body,
            Storage::F64($v) => $body,
        }
    };
}

impl Storage {
    /// `n` zeros, or an error (not an abort) if the memory cannot be had.
    fn zeros(prec: Prec, n: usize) -> Result<Storage> {
        fn zeroed<T: bytemuck::Zeroable>(n: usize) -> Result<Vec<T>> {
            crate::fallible::try_vec_zeroed(n, || format!("a host array of {n} elements"))
        }
        Ok(match prec {
            Prec::U8 => Storage::U8(zeroed(n)?),
            Prec::U16 => Storage::U16(zeroed(n)?),
            Prec::I32 => Storage::I32(zeroed(n)?),
            Prec::U32 => Storage::U32(zeroed(n)?),
            Prec::I64 => Storage::I64(zeroed(n)?),
            Prec::U64 => Storage::U64(zeroed(n)?),
            Prec::F16 => Storage::F16(zeroed(n)?),
            Prec::Bf16 => Storage::Bf16(zeroed(n)?),
            Prec::F32 => Storage::F32(zeroed(n)?),
            Prec::F64 => Storage::F64(zeroed(n)?),
        })
    }

    fn prec(&self) -> Prec {
        match self {
            Storage::U8(_) => Prec::U8,
            Storage::U16(_) => Prec::U16,
            Storage::I32(_) => Prec::I32,
            Storage::U32(_) => Prec::U32,
            Storage::I64(_) => Prec::I64,
            Storage::U64(_) => Prec::U64,
            Storage::F16(_) => Prec::F16,
            Storage::Bf16(_) => Prec::Bf16,
            Storage::F32(_) => Prec::F32,
            Storage::F64(_) => Prec::F64,
        }
    }

    fn len(&self) -> usize {
        with_storage!(self, v => v.len())
    }

    fn get(&self, i: usize) -> f64 {
        match self {
            Storage::U8(v) => v[i] as f64,
            Storage::U16(v) => v[i] as f64,
            Storage::I32(v) => v[i] as f64,
            Storage::U32(v) => v[i] as f64,
            Storage::I64(v) => v[i] as f64,
            Storage::U64(v) => v[i] as f64,
            Storage::F16(v) => v[i].to_f64(),
            Storage::Bf16(v) => v[i].to_f64(),
            Storage::F32(v) => v[i] as f64,
            Storage::F64(v) => v[i],
        }
    }

    fn set(&mut self, i: usize, x: f64) {
        match self {
            Storage::U8(v) => v[i] = x as u8,
            Storage::U16(v) => v[i] = x as u16,
            Storage::I32(v) => v[i] = x as i32,
            Storage::U32(v) => v[i] = x as u32,
            Storage::I64(v) => v[i] = x as i64,
            Storage::U64(v) => v[i] = x as u64,
            Storage::F16(v) => v[i] = f16::from_f64(x),
            Storage::Bf16(v) => v[i] = bf16::from_f64(x),
            Storage::F32(v) => v[i] = x as f32,
            Storage::F64(v) => v[i] = x,
        }
    }

    fn as_bytes(&self) -> &[u8] {
        with_storage!(self, v => bytemuck::cast_slice(v.as_slice()))
    }

    fn as_bytes_mut(&mut self) -> &mut [u8] {
        with_storage!(self, v => bytemuck::cast_slice_mut(v.as_mut_slice()))
    }
}

/// A host array: typed storage in row-major order, its (padded) dims and optional padding.
///
/// `dims` are the dims of the storage, margins included; [`Ndarray::logical_dims`] removes the
/// padding. Values are read and written as `f64` and converted to the array's precision with
/// [`Prec::round_value`] semantics.
#[derive(Clone, Debug, PartialEq)]
pub struct Ndarray {
    storage: Storage,
    dims: Vec<usize>,
    padding: Option<Padding>,
}

fn checked_num_elems(dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::OutOfMemory {
            what: format!("an array of dims {dims:?}"),
            bytes: usize::MAX,
        })
}

impl Ndarray {
    /// A zero-filled array of the given precision and dims (no padding).
    pub fn zeros(prec: Prec, dims: &[usize]) -> Result<Ndarray> {
        let n = checked_num_elems(dims)?;
        Ok(Ndarray {
            storage: Storage::zeros(prec, n)?,
            dims: dims.to_vec(),
            padding: None,
        })
    }

    /// An array with logical `dims` surrounded by `padding`; margins hold the pad value and the
    /// interior is zero.
    pub fn zeros_padded(prec: Prec, dims: &[usize], padding: Padding) -> Result<Ndarray> {
        let padded = padding.padded_dims(dims)?;
        let mut nd = Ndarray::zeros(prec, &padded)?;
        let value = padding.value;
        nd.padding = Some(padding);
        if value != 0.0 {
            nd.fill(value);
            nd.fill_interior(0.0);
        }
        Ok(nd)
    }

    /// An array holding `values` (converted to `prec`) with the given dims.
    pub fn from_f64(prec: Prec, dims: &[usize], values: &[f64]) -> Result<Ndarray> {
        let mut nd = Ndarray::zeros(prec, dims)?;
        nd.set_all_f64(values)?;
        Ok(nd)
    }

    /// An `f32` array holding `values` with the given dims.
    pub fn from_f32(dims: &[usize], values: &[f32]) -> Result<Ndarray> {
        let n = checked_num_elems(dims)?;
        if n != values.len() {
            return Err(size_mismatch("Ndarray::from_f32", n, values.len()));
        }
        Ok(Ndarray {
            storage: Storage::F32(values.to_vec()),
            dims: dims.to_vec(),
            padding: None,
        })
    }

    /// The same elements (moved, not copied) viewed with other storage `dims`: the same number
    /// of elements in the same row-major order. A padded array cannot be reshaped (its margins
    /// are laid out for its dims).
    pub fn reshaped(self, dims: &[usize]) -> Result<Ndarray> {
        if self.padding.is_some() {
            return Err(Error::invalid(format!(
                "reshaping a padded array of dims {:?}: its margins are laid out for those dims; \
                 reshape the unpadded values",
                self.dims
            )));
        }
        let n = checked_num_elems(dims)?;
        let have = checked_num_elems(&self.dims)?;
        if n != have {
            return Err(size_mismatch("Ndarray::reshaped", n, have));
        }
        Ok(Ndarray {
            dims: dims.to_vec(),
            ..self
        })
    }

    /// The same elements (moved, not copied), read as a padded array: its storage dims hold
    /// `padding`'s margins around logical dims of at least 1 each. The margins are used as
    /// they are (they should hold the pad value). An array that already has another padding is
    /// an error.
    pub fn with_padding(self, padding: Padding) -> Result<Ndarray> {
        if let Some(p) = &self.padding {
            if *p == padding {
                return Ok(self);
            }
            return Err(Error::BadValue {
                what: "padding".into(),
                value: format!("{padding:?}"),
                expected: format!("the array's own padding {p:?}"),
            });
        }
        if padding.axes.len() != self.dims.len()
            || padding
                .axes
                .iter()
                .zip(&self.dims)
                .any(|(a, &d)| a.left.saturating_add(a.right) >= d)
        {
            return Err(Error::ShapeMismatch {
                op: "Ndarray::with_padding".into(),
                shapes: vec![self.dims.clone()],
                detail: format!(
                    "storage dims {:?} cannot hold margins {:?} around at least one element per axis",
                    self.dims, padding.axes
                ),
            });
        }
        Ok(Ndarray {
            padding: Some(padding),
            ..self
        })
    }

    /// The element precision.
    pub fn prec(&self) -> Prec {
        self.storage.prec()
    }

    /// The storage dims, padding margins included.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The dims without padding.
    pub fn logical_dims(&self) -> Vec<usize> {
        match &self.padding {
            None => self.dims.clone(),
            Some(p) => self
                .dims
                .iter()
                .zip(&p.axes)
                .map(|(d, a)| d - a.left - a.right)
                .collect(),
        }
    }

    /// The padding, if any.
    pub fn padding(&self) -> Option<&Padding> {
        self.padding.as_ref()
    }

    /// Number of stored elements (margins included).
    pub fn num_elems(&self) -> usize {
        self.storage.len()
    }

    /// Size of the storage in bytes.
    pub fn size_in_bytes(&self) -> usize {
        self.num_elems() * self.prec().size_in_bytes()
    }

    /// The raw bytes of the storage (native endianness), e.g. for copying to a device.
    pub fn as_bytes(&self) -> &[u8] {
        self.storage.as_bytes()
    }

    /// The raw bytes of the storage, writable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        self.storage.as_bytes_mut()
    }

    /// The typed storage.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Flat position of a multi-index over the storage dims, checked.
    pub fn flat_index(&self, idx: &[usize]) -> Result<usize> {
        if let Some(problem) = OutOfBounds::check_index(idx, &self.dims) {
            return Err(Error::out_of_bounds("an array", problem));
        }
        Ok(idx
            .iter()
            .zip(&self.dims)
            .fold(0, |flat, (&i, &d)| flat * d + i))
    }

    fn check_flat(&self, i: usize) -> Result<()> {
        if i < self.num_elems() {
            Ok(())
        } else {
            Err(Error::out_of_bounds(
                "an array",
                OutOfBounds::Element {
                    index: i,
                    len: self.num_elems(),
                },
            ))
        }
    }

    /// The element at a flat position, as `f64`.
    pub fn get_flat(&self, i: usize) -> Result<f64> {
        self.check_flat(i)?;
        Ok(self.storage.get(i))
    }

    /// Sets the element at a flat position (converted to the array's precision).
    pub fn set_flat(&mut self, i: usize, x: f64) -> Result<()> {
        self.check_flat(i)?;
        self.storage.set(i, x);
        Ok(())
    }

    /// The element at a storage multi-index.
    pub fn get(&self, idx: &[usize]) -> Result<f64> {
        let i = self.flat_index(idx)?;
        Ok(self.storage.get(i))
    }

    /// Sets the element at a storage multi-index.
    pub fn set(&mut self, idx: &[usize], x: f64) -> Result<()> {
        let i = self.flat_index(idx)?;
        self.storage.set(i, x);
        Ok(())
    }

    /// This unpadded array's elements laid into the interior of new storage with `padding`
    /// around them (the margins hold the pad value), bit for bit in its precision. A padded
    /// array is an error (its margins are laid out already).
    pub fn into_padded(self, padding: Padding) -> Result<Ndarray> {
        if self.padding.is_some() {
            return Err(Error::invalid(
                "into_padded: the array is padded already; give it unpadded",
            ));
        }
        let mut out = Ndarray::zeros_padded(self.prec(), &self.dims, padding)?;
        let size = self.prec().size_in_bytes();
        let positions: Vec<usize> = out.interior_positions().collect();
        let (src, dst) = (self.as_bytes(), out.as_bytes_mut());
        for (k, i) in positions.into_iter().enumerate() {
            dst[i * size..(i + 1) * size].copy_from_slice(&src[k * size..(k + 1) * size]);
        }
        Ok(out)
    }

    /// Sets every stored element (margins included) to `x`.
    pub fn fill(&mut self, x: f64) {
        for i in 0..self.num_elems() {
            self.storage.set(i, x);
        }
    }

    /// Sets every logical (non-margin) element to `x`.
    pub fn fill_interior(&mut self, x: f64) {
        let positions = self.interior_positions();
        for i in positions {
            self.storage.set(i, x);
        }
    }

    /// Flat storage positions of the logical elements, in row-major logical order (computed as
    /// they are iterated: nothing of the array's size is allocated).
    pub fn interior_positions(&self) -> InteriorPositions {
        let logical = self.logical_dims();
        let left: Vec<usize> = match &self.padding {
            None => vec![0; self.dims.len()],
            Some(p) => p.axes.iter().map(|a| a.left).collect(),
        };
        // The dims were checked when the array was allocated, so the product fits.
        let remaining = logical.iter().product();
        InteriorPositions {
            dims: self.dims.clone(),
            idx: vec![0; logical.len()],
            logical,
            left,
            remaining,
        }
    }

    /// The logical elements (margins excluded) as `f64`, row-major; an
    /// [`Error::OutOfMemory`] if the copy cannot be allocated.
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        let positions = self.interior_positions();
        crate::fallible::try_collect(
            positions.len(),
            positions.map(|i| self.storage.get(i)),
            || format!("a copy of {} elements as f64", self.num_logical_elems()),
        )
    }

    /// The logical elements as `f32`.
    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        let positions = self.interior_positions();
        crate::fallible::try_collect(
            positions.len(),
            positions.map(|i| self.storage.get(i) as f32),
            || format!("a copy of {} elements as f32", self.num_logical_elems()),
        )
    }

    /// Number of logical (non-margin) elements.
    pub fn num_logical_elems(&self) -> usize {
        self.interior_positions().len()
    }

    fn check_value_count(&self, got: usize) -> Result<()> {
        let n = self.num_logical_elems();
        if n != got {
            return Err(size_mismatch("Ndarray::set_all", n, got));
        }
        Ok(())
    }

    /// Sets the logical elements from `values` (row-major, margins excluded).
    pub fn set_all_f64(&mut self, values: &[f64]) -> Result<()> {
        self.check_value_count(values.len())?;
        self.set_all_with(|k| values[k]);
        Ok(())
    }

    /// Sets logical element `k` (row-major, margins excluded) to `value(k)` for every `k`,
    /// without materializing the values.
    pub fn set_all_with(&mut self, mut value: impl FnMut(usize) -> f64) {
        for (k, i) in self.interior_positions().enumerate() {
            self.storage.set(i, value(k));
        }
    }

    /// Sets the logical elements from `f32` values.
    pub fn set_all_f32(&mut self, values: &[f32]) -> Result<()> {
        self.check_value_count(values.len())?;
        self.set_all_with(|k| values[k] as f64);
        Ok(())
    }

    /// Copies the bytes of `other` into this array; both must have the same precision and size.
    pub fn copy_from(&mut self, other: &Ndarray) -> Result<()> {
        if other.prec() != self.prec() || other.dims != self.dims {
            return Err(Error::ShapeMismatch {
                op: "Ndarray::copy_from".into(),
                shapes: vec![other.dims.clone(), self.dims.clone()],
                detail: format!(
                    "source is {} {:?}, destination is {} {:?}",
                    other.prec(),
                    other.dims,
                    self.prec(),
                    self.dims
                ),
            });
        }
        self.storage = other.storage.clone();
        Ok(())
    }
}

fn size_mismatch(op: &str, expected: usize, got: usize) -> Error {
    Error::SizeMismatch {
        op: op.into(),
        expected,
        given: got,
        unit: RangeUnit::Elements,
    }
}

fn format_value(prec: Prec, x: f64) -> String {
    let text = match prec {
        p if p.is_integer() => return format!("{}", x as i128),
        Prec::F64 => format!("{x}"),
        _ => format!("{}", x as f32),
    };
    if text.len() > 10 && x.is_finite() {
        format!("{x:.4e}")
    } else if x.is_finite() && !text.contains(['.', 'e']) {
        format!("{text}.0")
    } else {
        text
    }
}

/// The flat storage positions of an array's logical elements in row-major logical order: an
/// odometer over the logical dims, offset by the left margins.
#[derive(Clone, Debug)]
pub struct InteriorPositions {
    dims: Vec<usize>,
    logical: Vec<usize>,
    left: Vec<usize>,
    idx: Vec<usize>,
    remaining: usize,
}

impl Iterator for InteriorPositions {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let mut flat = 0;
        for a in 0..self.idx.len() {
            flat = flat * self.dims[a] + self.idx[a] + self.left[a];
        }
        for a in (0..self.idx.len()).rev() {
            self.idx[a] += 1;
            if self.idx[a] < self.logical[a] {
                break;
            }
            self.idx[a] = 0;
        }
        Some(flat)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for InteriorPositions {}

impl fmt::Display for Ndarray {
    /// Prints the storage (margins included) as nested brackets; long axes are elided in the
    /// middle.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const EDGE: usize = 4;
        fn rec(
            nd: &Ndarray,
            f: &mut fmt::Formatter<'_>,
            axis: usize,
            offset: usize,
            indent: usize,
        ) -> fmt::Result {
            let dims = &nd.dims;
            if axis == dims.len() {
                return f.write_str(&format_value(nd.prec(), nd.storage.get(offset)));
            }
            let stride: usize = dims[axis + 1..].iter().product();
            let d = dims[axis];
            f.write_str("[")?;
            let shown: Vec<Option<usize>> = if d > 2 * EDGE + 1 {
                (0..EDGE)
                    .map(Some)
                    .chain(std::iter::once(None))
                    .chain((d - EDGE..d).map(Some))
                    .collect()
            } else {
                (0..d).map(Some).collect()
            };
            for (k, i) in shown.iter().enumerate() {
                if k > 0 {
                    if axis + 1 == dims.len() {
                        f.write_str(", ")?;
                    } else {
                        write!(f, ",\n{:width$}", "", width = indent + 1)?;
                    }
                }
                match i {
                    Some(i) => rec(nd, f, axis + 1, offset + i * stride, indent + 1)?,
                    None => f.write_str("...")?,
                }
            }
            f.write_str("]")
        }
        write!(f, "{} {:?}", self.prec(), self.dims)?;
        if let Some(p) = &self.padding {
            write!(f, " padded {:?} with {}", p.axes, p.value)?;
        }
        f.write_str("\n")?;
        rec(self, f, 0, 0, 0)
    }
}

impl Ndarray {
    /// The element at a flat position as an exact [`Scalar`] (integers are not rounded through
    /// `f64`); `i` must be below `num_elems`.
    pub(crate) fn get_scalar(&self, i: usize) -> crate::ops::Scalar {
        use crate::ops::Scalar;
        match &self.storage {
            Storage::U8(v) => Scalar::I(v[i] as i128),
            Storage::U16(v) => Scalar::I(v[i] as i128),
            Storage::I32(v) => Scalar::I(v[i] as i128),
            Storage::U32(v) => Scalar::I(v[i] as i128),
            Storage::I64(v) => Scalar::I(v[i] as i128),
            Storage::U64(v) => Scalar::I(v[i] as i128),
            s => Scalar::F(s.get(i)),
        }
    }

    /// Stores a scalar at a flat position, converting it to the array's precision.
    pub(crate) fn set_scalar(&mut self, i: usize, x: crate::ops::Scalar) {
        use crate::ops::Scalar;
        let prec = self.prec();
        match (x.convert(prec), &mut self.storage) {
            (Scalar::I(n), Storage::U8(v)) => v[i] = n as u8,
            (Scalar::I(n), Storage::U16(v)) => v[i] = n as u16,
            (Scalar::I(n), Storage::I32(v)) => v[i] = n as i32,
            (Scalar::I(n), Storage::U32(v)) => v[i] = n as u32,
            (Scalar::I(n), Storage::I64(v)) => v[i] = n as i64,
            (Scalar::I(n), Storage::U64(v)) => v[i] = n as u64,
            (x, s) => s.set(i, x.to_f64()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_precision_stores_and_reads() {
        for p in Prec::ALL {
            let mut nd = Ndarray::zeros(p, &[2, 3]).unwrap();
            nd.set(&[1, 2], 7.0).unwrap();
            assert_eq!(nd.get(&[1, 2]).unwrap(), 7.0);
            assert_eq!(nd.get_flat(5).unwrap(), 7.0);
            assert_eq!(nd.size_in_bytes(), 6 * p.size_in_bytes());
            assert_eq!(nd.as_bytes().len(), nd.size_in_bytes());
        }
    }

    #[test]
    fn out_of_range_indices_are_errors() {
        let nd = Ndarray::zeros(Prec::F32, &[2, 3]).unwrap();
        assert!(matches!(
            nd.get(&[2, 0]),
            Err(Error::IndexOutOfBounds { .. })
        ));
        assert!(nd.get(&[0]).is_err());
        assert!(nd.get_flat(6).is_err());
    }

    #[test]
    fn padding_keeps_margins_and_logical_view() {
        let pad = Padding {
            axes: vec![AxisPadding { left: 1, right: 1 }],
            value: -1.0,
        };
        let mut nd = Ndarray::zeros_padded(Prec::F32, &[3], pad).unwrap();
        assert_eq!(nd.dims(), &[5]);
        assert_eq!(nd.logical_dims(), vec![3]);
        nd.set_all_f64(&[1.0, 2.0, 3.0]).unwrap();
        assert_eq!(nd.to_vec_f64().unwrap(), vec![1.0, 2.0, 3.0]);
        assert_eq!(nd.get(&[0]).unwrap(), -1.0);
        assert_eq!(nd.get(&[4]).unwrap(), -1.0);
    }

    #[test]
    fn wrong_number_of_values_is_an_error() {
        let mut nd = Ndarray::zeros(Prec::F64, &[2, 2]).unwrap();
        assert!(matches!(
            nd.set_all_f64(&[1.0; 3]),
            Err(Error::SizeMismatch {
                expected: 4,
                given: 3,
                ..
            })
        ));
        assert!(Ndarray::from_f32(&[2], &[1.0; 3]).is_err());
    }

    #[test]
    fn printing_is_readable() {
        let nd = Ndarray::from_f64(Prec::F32, &[2, 2], &[1.0, 2.5, -3.0, 4.0]).unwrap();
        assert_eq!(nd.to_string(), "f32 [2, 2]\n[[1.0, 2.5],\n [-3.0, 4.0]]");
        let long = Ndarray::zeros(Prec::I32, &[20]).unwrap();
        assert!(long.to_string().contains("..."));
    }
}
