//! Host work too large for one thread, shared among the machine's threads: filling parameters
//! (see `Ndarray::fill_with`) and copying large arrays between the host and CPU devices, whose
//! cost is mostly the first touch of fresh pages (one kernel page fault per 4 KiB) rather than
//! the memory's bandwidth.
//!
//! Parts are taken from one queue by the threads started and by the caller's own, so a thread
//! the system refuses to start only leaves more parts to the others; the result never depends
//! on which thread did which part.

use std::sync::Mutex;

/// Bytes from which a copy is split among threads (smaller copies cost less than starting a
/// thread).
pub const PARALLEL_COPY_FROM: usize = 8 << 20;

/// Parts per thread: more than one balances threads that run slower than others.
const PARTS_PER_THREAD: usize = 4;

/// The threads worth starting for work of `len` units that pays from `parallel_from` units.
pub fn threads_for(len: usize, parallel_from: usize) -> usize {
    if len < parallel_from {
        1
    } else {
        std::thread::available_parallelism().map_or(1, usize::from)
    }
}

/// The length of each part when `len` units are split for `threads` threads, a multiple of
/// `granule` (so that parts start where a lone thread's chunks would).
pub fn part_length(len: usize, threads: usize, granule: usize) -> usize {
    let granule = granule.max(1);
    len.div_ceil(threads.max(1) * PARTS_PER_THREAD)
        .div_ceil(granule)
        .max(1)
        * granule
}

/// Runs `work` on every part, on `threads` threads (the caller's among them).
pub fn run_parts<T: Send>(parts: Vec<T>, threads: usize, work: impl Fn(T) + Sync) {
    if threads <= 1 || parts.len() <= 1 {
        parts.into_iter().for_each(work);
        return;
    }
    let queue = Mutex::new(parts);
    let drain = || {
        loop {
            let next = queue.lock().unwrap_or_else(|e| e.into_inner()).pop();
            match next {
                Some(part) => work(part),
                None => break,
            }
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..threads {
            // A thread that cannot be started is no error: the others take its parts.
            let _ = std::thread::Builder::new()
                .name("arrayjit host".into())
                .spawn_scoped(scope, drain);
        }
        drain();
    });
}

/// Copies `src` into `dst` (of the same length), on several threads when it is large.
///
/// # Panics
/// If the lengths differ, as `<[u8]>::copy_from_slice` does; callers check sizes first.
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_bytes: lengths differ");
    let threads = threads_for(src.len(), PARALLEL_COPY_FROM);
    if threads == 1 {
        dst.copy_from_slice(src);
        return;
    }
    // Whole pages per part, so no page is faulted in by two threads.
    let per = part_length(src.len(), threads, 4096);
    let parts: Vec<(&mut [u8], &[u8])> = dst.chunks_mut(per).zip(src.chunks(per)).collect();
    run_parts(parts, threads, |(d, s)| d.copy_from_slice(s));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_copy_on_several_threads_equals_the_source() {
        // Not a multiple of a page, above the threshold.
        let n = PARALLEL_COPY_FROM + 12_345;
        let src: Vec<u8> = (0..n).map(|i| (i * 7 + i / 4099) as u8).collect();
        let mut dst = vec![0u8; n];
        copy_bytes(&mut dst, &src);
        assert!(dst == src);
        let mut small = vec![0u8; 10];
        copy_bytes(&mut small, &src[..10]);
        assert_eq!(small, src[..10]);
    }

    #[test]
    fn parts_cover_every_unit_once_in_granules() {
        for (len, threads, granule) in
            [(1, 2, 4096), (10_000, 2, 4096), (1 << 20, 16, 7), (5, 1, 1)]
        {
            let per = part_length(len, threads, granule);
            assert_eq!(per % granule, 0);
            let covered: usize = (0..len).step_by(per).map(|s| per.min(len - s)).sum();
            assert_eq!(covered, len);
        }
        let seen = Mutex::new(vec![0u32; 100]);
        run_parts((0..100).collect(), 3, |i: usize| {
            seen.lock().unwrap()[i] += 1;
        });
        assert!(seen.into_inner().unwrap().iter().all(|&c| c == 1));
    }
}
