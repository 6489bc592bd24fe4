//! Which device copies of a hosted node hold its latest values (the reference's
//! `devices_not_lagging_host`, per copy): a copy is up to date, lags the host in some ranges of
//! elements (the host changed single elements since it was up to date), or lags wholly. Partial
//! uploads clear ranges; anything else that makes a copy current makes it wholly current.

use super::{Tnode, lock};

impl Tnode {
    /// Ids of the device copies (arrays) of the node that hold its latest values.
    pub fn copies_not_lagging_host(&self) -> Vec<usize> {
        let sync = lock(&self.0.host_sync);
        sync.copies_not_lagging_host
            .iter()
            .copied()
            .filter(|c| sync.dirty.get(c).is_none_or(Vec::is_empty))
            .collect()
    }

    /// Whether device copy `copy` holds the latest values.
    pub fn copy_not_lagging(&self, copy: usize) -> bool {
        let sync = lock(&self.0.host_sync);
        sync.copies_not_lagging_host.contains(&copy)
            && sync.dirty.get(&copy).is_none_or(Vec::is_empty)
    }

    /// The ranges of stored elements `[start, end)` in which copy `copy` lags the host, if it
    /// lags only there (`Some(vec![])`: up to date); `None` when it lags wholly.
    pub fn copy_lagging_ranges(&self, copy: usize) -> Option<Vec<(usize, usize)>> {
        let sync = lock(&self.0.host_sync);
        sync.copies_not_lagging_host
            .contains(&copy)
            .then(|| sync.dirty.get(&copy).cloned().unwrap_or_default())
    }

    /// Records that device copy `copy` now holds the latest values (it read the host's, or
    /// received another up-to-date copy).
    pub fn mark_copy_up_to_date(&self, copy: usize) {
        let mut sync = lock(&self.0.host_sync);
        sync.copies_not_lagging_host.insert(copy);
        sync.dirty.remove(&copy);
    }

    /// Records that device copy `copy` changed the node: the host and every other copy lag.
    pub fn mark_changed_in_copy(&self, copy: usize) {
        let mut sync = lock(&self.0.host_sync);
        sync.copies_not_lagging_host.clear();
        sync.dirty.clear();
        sync.copies_not_lagging_host.insert(copy);
    }

    /// Records that the host array now holds device copy `copy`'s values (an explicit copy to
    /// the host): that copy alone does not lag, and a pending refresh from another copy is
    /// dropped.
    pub fn host_refreshed_from(&self, copy: usize) {
        let mut sync = lock(&self.0.host_sync);
        sync.copies_not_lagging_host.clear();
        sync.dirty.clear();
        sync.copies_not_lagging_host.insert(copy);
        sync.prepare_read = None;
    }

    /// Records that the host changed the node: every device copy lags wholly.
    pub fn mark_changed_on_host(&self) {
        let mut sync = lock(&self.0.host_sync);
        sync.copies_not_lagging_host.clear();
        sync.dirty.clear();
    }

    /// Records that the host changed stored elements `start..end`: copies that were up to date
    /// lag in those elements only.
    pub fn mark_changed_on_host_range(&self, start: usize, end: usize) {
        let mut sync = lock(&self.0.host_sync);
        let copies: Vec<usize> = sync.copies_not_lagging_host.iter().copied().collect();
        for c in copies {
            let ranges = sync.dirty.entry(c).or_default();
            ranges.push((start, end));
            merge(ranges);
        }
    }

    /// Records that stored elements `start..end` of copy `copy` were copied from the host: a
    /// copy lagging only in some ranges no longer lags in these (a wholly lagging copy still
    /// does).
    pub fn mark_range_up_to_date(&self, copy: usize, start: usize, end: usize) {
        let mut sync = lock(&self.0.host_sync);
        if let Some(ranges) = sync.dirty.get_mut(&copy) {
            *ranges = ranges
                .iter()
                .flat_map(|&(a, b)| {
                    let left = (a, b.min(start));
                    let right = (a.max(end), b);
                    [left, right].into_iter().filter(|(x, y)| x < y)
                })
                .collect();
        }
    }
}

/// Sorts ranges and joins the overlapping or touching ones.
fn merge(ranges: &mut Vec<(usize, usize)>) {
    ranges.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
    for &(a, b) in ranges.iter() {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    *ranges = out;
}

#[cfg(test)]
mod tests {
    use super::merge;

    #[test]
    fn ranges_merge_when_they_overlap_or_touch() {
        let mut r = vec![(5, 6), (1, 2), (2, 4), (8, 9), (5, 7)];
        merge(&mut r);
        assert_eq!(r, vec![(1, 4), (5, 7), (8, 9)]);
    }
}
