//! Filling an array's logical elements from a function of their position, chunk by chunk and
//! on several threads: parameter initializers fill hundreds of millions of elements, which
//! one element at a time (a dynamic call and a precision dispatch each) would dominate a large
//! model's build time. The values do not depend on the chunking or the threads: element `k`
//! is what the function gives for position `k`.

use half::{bf16, f16};

use super::{Ndarray, Storage};
use crate::host_threads;

/// Elements computed per call of the fill function.
const CHUNK: usize = 4096;

/// Elements below which one thread fills the array (starting threads costs more).
const PARALLEL_FROM: usize = 1 << 18;

/// A storage element made from an `f64`, as [`Storage`]'s setter converts it.
trait FromF64: Copy + Send {
    fn from_f64(x: f64) -> Self;
}

macro_rules! from_f64_as {
    ($($t:ty),*) => {
        $(impl FromF64 for $t {
            fn from_f64(x: f64) -> Self {
                x as $t
            }
        })*
    };
}
from_f64_as!(u8, u16, i32, u32, i64, u64, f32, f64);

impl FromF64 for f16 {
    fn from_f64(x: f64) -> Self {
        f16::from_f64(x)
    }
}

impl FromF64 for bf16 {
    fn from_f64(x: f64) -> Self {
        bf16::from_f64(x)
    }
}

/// Fills `part` (elements `first..` of the array) chunk by chunk.
fn fill_part<T: FromF64>(part: &mut [T], first: usize, fill: &(impl Fn(usize, &mut [f64]) + Sync)) {
    let mut buf = [0f64; CHUNK];
    for (c, out) in part.chunks_mut(CHUNK).enumerate() {
        let values = &mut buf[..out.len()];
        fill(first + c * CHUNK, values);
        for (o, &x) in out.iter_mut().zip(values.iter()) {
            *o = T::from_f64(x);
        }
    }
}

/// Fills all of `v` (an unpadded array's storage), sharing it among the machine's threads
/// when it is large (see [`crate::host_threads`]); parts hold whole chunks, so every chunk
/// starts where a lone thread's would.
fn fill_typed<T: FromF64>(v: &mut [T], fill: &(impl Fn(usize, &mut [f64]) + Sync)) {
    let threads = host_threads::threads_for(v.len(), PARALLEL_FROM);
    let per = host_threads::part_length(v.len(), threads, CHUNK);
    let parts: Vec<(usize, &mut [T])> = v
        .chunks_mut(per)
        .enumerate()
        .map(|(p, part)| (p * per, part))
        .collect();
    host_threads::run_parts(parts, threads, |(first, part)| fill_part(part, first, fill));
}

impl Ndarray {
    /// Sets every logical element (row-major, margins excluded) from `fill(start, out)`, which
    /// writes the values of positions `start..start + out.len()` into `out`. Large unpadded
    /// arrays are filled on several threads; the result is the same as on one.
    pub fn fill_with(&mut self, fill: impl Fn(usize, &mut [f64]) + Sync) {
        if self.padding.is_some() {
            // The interior's storage positions, a chunk at a time (not all collected first).
            let mut positions = self.interior_positions();
            let (mut at, mut buf) = ([0usize; CHUNK], [0f64; CHUNK]);
            let mut start = 0;
            loop {
                let n = at
                    .iter_mut()
                    .zip(positions.by_ref())
                    .map(|(slot, i)| *slot = i)
                    .count();
                if n == 0 {
                    return;
                }
                fill(start, &mut buf[..n]);
                for (&i, &x) in at[..n].iter().zip(&buf[..n]) {
                    self.storage.set(i, x);
                }
                start += n;
            }
        }
        match &mut self.storage {
            Storage::U8(v) => fill_typed(v, &fill),
            Storage::U16(v) => fill_typed(v, &fill),
            Storage::I32(v) => fill_typed(v, &fill),
            Storage::U32(v) => fill_typed(v, &fill),
            Storage::I64(v) => fill_typed(v, &fill),
            Storage::U64(v) => fill_typed(v, &fill),
            Storage::F16(v) => fill_typed(v, &fill),
            Storage::Bf16(v) => fill_typed(v, &fill),
            Storage::F32(v) => fill_typed(v, &fill),
            Storage::F64(v) => fill_typed(v, &fill),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ndarray::{AxisPadding, Ndarray, Padding};
    use crate::prec::Prec;

    #[test]
    fn fills_the_interior_of_padded_and_unpadded_arrays_by_position() {
        let mut plain = Ndarray::zeros(Prec::I32, &[3, 4]).unwrap();
        plain.fill_with(|start, out| {
            for (k, o) in out.iter_mut().enumerate() {
                *o = (start + k) as f64;
            }
        });
        assert_eq!(
            plain.to_vec_f64().unwrap(),
            (0..12).map(f64::from).collect::<Vec<_>>()
        );
        let pad = Padding {
            axes: vec![AxisPadding { left: 1, right: 1 }, AxisPadding::default()],
            value: -1.0,
        };
        let mut padded = Ndarray::zeros_padded(Prec::F32, &[2, 3], pad).unwrap();
        padded.fill_with(|start, out| {
            for (k, o) in out.iter_mut().enumerate() {
                *o = 10.0 + (start + k) as f64;
            }
        });
        assert_eq!(
            padded.to_vec_f64().unwrap(),
            vec![10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
        );
        // The margins keep the pad value.
        assert_eq!(padded.get(&[0, 0]).unwrap(), -1.0);
        assert_eq!(padded.get(&[3, 2]).unwrap(), -1.0);
        // A padded array of several chunks: every interior element once, by position.
        let pad = Padding {
            axes: vec![AxisPadding { left: 2, right: 1 }],
            value: -1.0,
        };
        let n = 2 * super::CHUNK + 5;
        let mut long = Ndarray::zeros_padded(Prec::F64, &[n], pad).unwrap();
        long.fill_with(|start, out| {
            for (k, o) in out.iter_mut().enumerate() {
                *o = (start + k) as f64;
            }
        });
        let v = long.to_vec_f64().unwrap();
        assert_eq!(v.len(), n);
        assert!(v.iter().enumerate().all(|(k, &x)| x == k as f64));
        assert_eq!(long.get(&[1]).unwrap(), -1.0);
        assert_eq!(long.get(&[n + 2]).unwrap(), -1.0);
    }

    #[test]
    fn a_large_fill_on_several_threads_covers_every_element_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let n = (1 << 20) + 4097;
        let mut nd = Ndarray::zeros(Prec::F64, &[n]).unwrap();
        let (asked, calls) = (AtomicUsize::new(0), AtomicUsize::new(0));
        nd.fill_with(|start, out| {
            asked.fetch_add(out.len(), Ordering::Relaxed);
            calls.fetch_add(1, Ordering::Relaxed);
            for (k, o) in out.iter_mut().enumerate() {
                *o = (start + k) as f64 + 1.0;
            }
        });
        assert_eq!(asked.into_inner(), n);
        assert_eq!(calls.into_inner(), n.div_ceil(super::CHUNK));
        let v = nd.to_vec_f64().unwrap();
        assert!(v.iter().enumerate().all(|(k, &x)| x == k as f64 + 1.0));
    }
}
