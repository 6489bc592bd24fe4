//! The release list's rules on a fake device whose work finishes when the test says so.

use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

/// A device with one counter of work enqueued and one of work finished; a fence is the count
/// enqueued when it was recorded.
#[derive(Default)]
struct FakeDevice {
    enqueued: AtomicU64,
    finished: AtomicU64,
    fences: AtomicU64,
    freed: Mutex<Vec<u64>>,
    /// Frees the driver refuses.
    refuse_frees: std::sync::atomic::AtomicBool,
}

impl FenceDriver for FakeDevice {
    type Fence = u64;
    fn fence(&self) -> Result<u64> {
        self.fences.fetch_add(1, Ordering::SeqCst);
        Ok(self.enqueued.load(Ordering::SeqCst))
    }
    fn passed(&self, fence: &u64) -> Result<bool> {
        Ok(self.finished.load(Ordering::SeqCst) >= *fence)
    }
    fn wait(&self, fence: &u64) -> Result<()> {
        self.finished.fetch_max(*fence, Ordering::SeqCst);
        Ok(())
    }
    fn free(&self, ptr: u64) -> Result<()> {
        if self.refuse_frees.load(Ordering::SeqCst) {
            return Err(arrayjit_ir::Error::invalid("the driver refused the free"));
        }
        self.freed.lock().unwrap().push(ptr);
        Ok(())
    }
    fn label(&self) -> String {
        "fake:0".into()
    }
}

/// Memory still used by queued work is freed once that work has finished, not before; the
/// bytes count as freed only then. Memory no work uses is freed at once.
#[test]
fn memory_is_freed_after_the_work_queued_before_its_release() {
    let device = FakeDevice::default();
    let gate = RwLock::new(());
    let list = Releases::<u64>::default();
    device.enqueued.store(3, Ordering::SeqCst);
    list.release(0x1000, 256);
    assert_eq!(
        list.reclaim(&device, &gate, false),
        0,
        "freed under running work"
    );
    assert_eq!(list.pending_bytes(), 256);
    // Work enqueued after the release does not hold it back.
    device.enqueued.store(9, Ordering::SeqCst);
    device.finished.store(3, Ordering::SeqCst);
    assert_eq!(list.reclaim(&device, &gate, false), 256);
    assert_eq!(*device.freed.lock().unwrap(), [0x1000]);
    assert_eq!(list.pending_bytes(), 0);
    // On an idle device, at once.
    device.finished.store(9, Ordering::SeqCst);
    list.release(0x2000, 512);
    assert_eq!(list.reclaim(&device, &gate, false), 512);
}

/// While a stream captures (the gate held shared), nothing is fenced or freed; the release
/// waits for the next chance after the capture. Asked to wait (out of memory), the reclaim
/// waits for the capture to end, then frees.
#[test]
fn nothing_is_fenced_or_freed_while_a_stream_captures() {
    let device = FakeDevice::default();
    let gate = RwLock::new(());
    let list = Releases::<u64>::default();
    let capturing = gate.read().unwrap();
    list.release(0x1000, 256);
    assert_eq!(list.reclaim(&device, &gate, false), 0);
    assert_eq!(device.fences.load(Ordering::SeqCst), 0);
    drop(capturing);
    assert_eq!(list.reclaim(&device, &gate, false), 256);
    assert_eq!(device.fences.load(Ordering::SeqCst), 1);
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _capturing = gate.read().unwrap();
            entered_tx.send(()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert_eq!(
                device.fences.load(Ordering::SeqCst),
                1,
                "fenced during the capture"
            );
        });
        entered_rx.recv().unwrap();
        list.release(0x2000, 128);
        assert_eq!(list.reclaim(&device, &gate, true), 128);
    });
}

/// Asked to wait, the list waits for the fences and frees everything; several releases share
/// one fence.
#[test]
fn a_waiting_reclaim_frees_everything_released() {
    let device = FakeDevice::default();
    let gate = RwLock::new(());
    let list = Releases::<u64>::default();
    device.enqueued.store(5, Ordering::SeqCst);
    let _capturing = gate.read().unwrap();
    for i in 0..4 {
        list.release(0x1000 * (i + 1), 100);
    }
    drop(_capturing);
    assert_eq!(list.reclaim(&device, &gate, true), 400);
    assert_eq!(device.fences.load(Ordering::SeqCst), 1);
    assert_eq!(device.freed.lock().unwrap().len(), 4);
}

/// A free the driver refuses: the bytes stay counted as used (nothing is returned), the entry
/// leaves the list (it is not tried again).
#[test]
fn a_refused_free_keeps_its_bytes_counted() {
    let device = FakeDevice::default();
    let gate = RwLock::new(());
    let list = Releases::<u64>::default();
    device.refuse_frees.store(true, Ordering::SeqCst);
    list.release(0x1000, 256);
    assert_eq!(list.reclaim(&device, &gate, false), 0);
    assert_eq!(list.pending_bytes(), 0);
}

/// A device whose streams may be capturing: fencing or freeing during a capture fails the test.
#[derive(Default)]
struct CapturingDevice {
    capturing: std::sync::atomic::AtomicBool,
    inner: FakeDevice,
    touched_during_capture: AtomicU64,
}

impl FenceDriver for CapturingDevice {
    type Fence = u64;
    fn fence(&self) -> Result<u64> {
        if self.capturing.load(Ordering::SeqCst) {
            self.touched_during_capture.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.fence()
    }
    fn passed(&self, fence: &u64) -> Result<bool> {
        self.inner.passed(fence)
    }
    fn wait(&self, fence: &u64) -> Result<()> {
        self.inner.wait(fence)
    }
    fn free(&self, ptr: u64) -> Result<()> {
        if self.capturing.load(Ordering::SeqCst) {
            self.touched_during_capture.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.free(ptr)
    }
    fn label(&self) -> String {
        "fake:0".into()
    }
}

/// One thread captures 200 times (holding the gate shared, as a launch does), another releases
/// and reclaims 200 allocations meanwhile: no fence and no free lands inside a capture, and
/// everything is freed in the end.
#[test]
fn frees_from_other_threads_never_land_inside_a_capture() {
    let device = CapturingDevice::default();
    let gate = RwLock::new(());
    let list = Releases::<u64>::default();
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..200 {
                let _capturing = gate.read().unwrap();
                device.capturing.store(true, Ordering::SeqCst);
                std::thread::yield_now();
                device.capturing.store(false, Ordering::SeqCst);
            }
        });
        s.spawn(|| {
            for i in 0..200u64 {
                list.release(0x1000 + i, 8);
                list.reclaim(&device, &gate, false);
                std::thread::yield_now();
            }
        });
    });
    list.reclaim(&device, &gate, true);
    assert_eq!(device.touched_during_capture.load(Ordering::SeqCst), 0);
    assert_eq!(device.inner.freed.lock().unwrap().len(), 200);
    assert_eq!(list.pending_bytes(), 0);
}
