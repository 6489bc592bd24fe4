//! Device time of a launch from timestamps the GPU writes: at the start of the launch's first
//! compute pass and the end of its last, resolved into a buffer, copied to a mappable one, and
//! read when the mapping completes (during a later poll of the device, e.g. when the host
//! waits for the queue). The difference in ticks times the queue's timestamp period is the
//! kernel's time on the device, queueing and host work excluded.

use std::time::Duration;

use crate::compiled_batch::DeviceTimeSink;

/// The query set and buffers of one timed launch.
pub(super) struct Timing {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    readback: wgpu::Buffer,
}

/// Bytes of the two resolved timestamps.
const BYTES: u64 = 2 * std::mem::size_of::<u64>() as u64;

impl Timing {
    pub(super) fn new(device: &wgpu::Device) -> Timing {
        let queries = device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("arrayjit launch timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        });
        let buffer = |usage| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("arrayjit launch timestamps"),
                size: BYTES,
                usage,
                mapped_at_creation: false,
            })
        };
        Timing {
            queries,
            resolved: buffer(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
            readback: buffer(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
        }
    }

    /// The writes of pass `first`/`last` of the launch (a single pass is both); none for the
    /// passes between (wgpu refuses timestamp writes that write nothing).
    pub(super) fn writes(
        &self,
        first: bool,
        last: bool,
    ) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        (first || last).then(|| wgpu::ComputePassTimestampWrites {
            query_set: &self.queries,
            beginning_of_pass_write_index: first.then_some(0),
            end_of_pass_write_index: last.then_some(1),
        })
    }

    /// Resolves the timestamps and copies them where the host can map them, after the passes.
    pub(super) fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        encoder.resolve_query_set(&self.queries, 0..2, &self.resolved, 0);
        encoder.copy_buffer_to_buffer(&self.resolved, 0, &self.readback, 0, BYTES);
    }

    /// After the submission: gives `sink` the device time once the copy can be read. A failed
    /// mapping (a lost device) drops the sink: the run stays untimed.
    pub(super) fn report(self, period_ns: f64, sink: DeviceTimeSink) {
        let readback = self.readback.clone();
        self.readback
            .slice(..)
            .map_async(wgpu::MapMode::Read, move |mapped| {
                if mapped.is_err() {
                    return;
                }
                let ticks = {
                    let Ok(bytes) = readback.slice(..).get_mapped_range() else {
                        return;
                    };
                    let word = |i: usize| {
                        let mut w = [0u8; 8];
                        w.copy_from_slice(&bytes[8 * i..8 * i + 8]);
                        u64::from_le_bytes(w)
                    };
                    word(1).saturating_sub(word(0))
                };
                readback.unmap();
                sink(Duration::from_nanos((ticks as f64 * period_ns) as u64));
            });
    }
}
