//! The queue between a `Multicore` stream's handles and its worker thread.
//!
//! Rules:
//! 1. Tasks leave the queue in the order they entered it, and a task's schedule position is
//!    taken under the same lock as its place in the queue, so queue order is event order.
//! 2. A thread other than the worker blocks while the queue holds `capacity` tasks
//!    (backpressure), without holding any lock the worker needs.
//! 3. The worker itself never blocks on a full queue: a task that schedules onto its own stream
//!    is queued past the capacity (only the worker could drain the queue, so waiting for room
//!    would never end). The queue shrinks back as the worker runs those tasks.
//! 4. Once closed, the queue accepts nothing; the worker finishes the tasks already queued and
//!    then stops.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::task::{Task, TaskLabel};

struct State {
    tasks: VecDeque<(Task, TaskLabel)>,
    closed: bool,
    /// Whether the consumer sleeps on `not_empty`, and how many producers on `not_full`: a
    /// condition variable is signalled only when someone waits on it (a signal is a syscall).
    consumer_waits: bool,
    producers_waiting: usize,
}

/// A bounded FIFO of tasks that its own consumer may overfill (see the module rules).
pub(crate) struct TaskQueue {
    state: Mutex<State>,
    not_empty: Condvar,
    not_full: Condvar,
    capacity: usize,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl TaskQueue {
    /// An empty queue holding up to `capacity` tasks (at least one) before producers block.
    pub fn new(capacity: usize) -> TaskQueue {
        let capacity = capacity.max(1);
        TaskQueue {
            state: Mutex::new(State {
                tasks: VecDeque::with_capacity(capacity),
                closed: false,
                consumer_waits: false,
                producers_waiting: 0,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            capacity,
        }
    }

    /// Queues a task, after `number` has given it its schedule position (called under the
    /// queue's lock, once there is room). `from_worker`: the caller is the consumer, which
    /// never waits for room. Returns the task back if the queue is closed (`number` is not
    /// called then).
    pub fn push(
        &self,
        task: Task,
        label: TaskLabel,
        from_worker: bool,
        number: impl FnOnce(),
    ) -> std::result::Result<(), (Task, TaskLabel)> {
        let mut state = lock(&self.state);
        while !from_worker && !state.closed && state.tasks.len() >= self.capacity {
            state.producers_waiting += 1;
            state = self.not_full.wait(state).unwrap_or_else(|e| e.into_inner());
            state.producers_waiting -= 1;
        }
        if state.closed {
            return Err((task, label));
        }
        number();
        state.tasks.push_back((task, label));
        let wake = state.consumer_waits;
        drop(state);
        if wake {
            self.not_empty.notify_one();
        }
        Ok(())
    }

    /// The next task, waiting while the queue is empty; `None` once it is closed and drained.
    pub fn pop(&self) -> Option<(Task, TaskLabel)> {
        let mut state = lock(&self.state);
        loop {
            if let Some(next) = state.tasks.pop_front() {
                let wake = state.producers_waiting > 0;
                drop(state);
                if wake {
                    self.not_full.notify_one();
                }
                return Some(next);
            }
            if state.closed {
                return None;
            }
            state.consumer_waits = true;
            state = self
                .not_empty
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
            state.consumer_waits = false;
        }
    }

    /// Refuses further tasks and wakes every waiter; queued tasks still run.
    pub fn close(&self) {
        lock(&self.state).closed = true;
        self.not_empty.notify_all();
        self.not_full.notify_all();
    }

    /// How many tasks are queued now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        lock(&self.state).tasks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn noop() -> Task {
        Box::new(|| Ok(()))
    }

    #[test]
    fn the_consumer_overfills_and_others_wait_for_room() {
        let q = Arc::new(TaskQueue::new(1));
        q.push(noop(), TaskLabel::Fixed("a"), false, || {})
            .ok()
            .unwrap();
        // The worker may exceed the capacity.
        q.push(noop(), TaskLabel::Fixed("b"), true, || {})
            .ok()
            .unwrap();
        assert_eq!(q.len(), 2);
        // Another producer waits until the consumer has made room.
        let q2 = q.clone();
        let producer = std::thread::spawn(move || {
            q2.push(noop(), TaskLabel::Fixed("c"), false, || {}).is_ok()
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(q.len(), 2, "the producer must wait for room");
        let order: Vec<String> = (0..2).map(|_| q.pop().unwrap().1.to_string()).collect();
        assert!(producer.join().unwrap());
        assert_eq!(order, ["a", "b"]);
        assert_eq!(q.pop().unwrap().1.to_string(), "c");
        q.close();
        assert!(q.pop().is_none());
        assert!(q.push(noop(), TaskLabel::Fixed("d"), false, || {}).is_err());
    }

    #[test]
    fn closing_wakes_a_waiting_producer() {
        let q = Arc::new(TaskQueue::new(1));
        q.push(noop(), TaskLabel::Fixed("a"), false, || {})
            .ok()
            .unwrap();
        let q2 = q.clone();
        let producer = std::thread::spawn(move || {
            q2.push(noop(), TaskLabel::Fixed("b"), false, || {})
                .is_err()
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        q.close();
        assert!(producer.join().unwrap(), "a closed queue refuses the task");
    }
}
