//! The memory planner: packs arrays into pools at aligned offsets, deterministically, letting
//! arrays whose lifetimes do not overlap share memory. Used for a routine's scratch locals
//! (lifetimes are statement intervals) and for a context's persistent arrays (which live as
//! long as the context).

use std::fmt;

use arrayjit_ir::error::{Error, Result};
use arrayjit_ir::tnode::Tnode;

/// An array to place: its node, size and lifetime (inclusive statement interval, or `None`
/// for "as long as the pool").
#[derive(Clone, Debug)]
pub struct PlanItem {
    /// The node stored.
    pub node: Tnode,
    /// Bytes needed.
    pub size: usize,
    /// First and last statement using it; `None` means it lives as long as the pool.
    pub lifetime: Option<(usize, usize)>,
}

/// Where one array lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    /// The node stored.
    pub node: Tnode,
    /// Which pool of the plan.
    pub pool: usize,
    /// Byte offset in the pool (a multiple of the plan's alignment).
    pub offset: usize,
    /// Bytes.
    pub size: usize,
    /// Its lifetime, as given.
    pub lifetime: Option<(usize, usize)>,
}

/// A packing of arrays into one or more pools.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Offsets are multiples of this.
    pub alignment: usize,
    /// Size of each pool in bytes.
    pub pool_sizes: Vec<usize>,
    /// Every array's place, in the order the planner placed them.
    pub slots: Vec<Slot>,
    /// Bytes left unused before, between and after the arrays of a pool (0: packed tight).
    /// With guards, an access just outside an array lands in memory no array uses, which a
    /// checker (AddressSanitizer poisoning, see [`MemoryPlan::unused_ranges`]) can catch.
    pub guard_bytes: usize,
}

fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

fn overlaps(a: Option<(usize, usize)>, b: Option<(usize, usize)>) -> bool {
    match (a, b) {
        (Some((s1, e1)), Some((s2, e2))) => s1 <= e2 && s2 <= e1,
        _ => true,
    }
}

impl MemoryPlan {
    /// Packs `items`: largest first (ties by node id, so the same program always gets the same
    /// places), each at the lowest aligned offset of the first pool where it does not collide
    /// with an array whose lifetime overlaps its own. A pool holds at most `max_pool_bytes`, so
    /// many small arrays share a few allocations; an array larger than that gets a pool of its
    /// own, as large as it needs (which later arrays may share where their lifetimes allow).
    /// Only a size no address space holds (with alignment and guards) is an error.
    pub fn pack(items: &[PlanItem], alignment: usize, max_pool_bytes: usize) -> Result<MemoryPlan> {
        MemoryPlan::pack_guarded(items, alignment, max_pool_bytes, 0)
    }

    /// Like [`MemoryPlan::pack`], with at least `guard_bytes` unused before the first array of
    /// a pool, between any two arrays whose lifetimes overlap, and after the last.
    pub fn pack_guarded(
        items: &[PlanItem],
        alignment: usize,
        max_pool_bytes: usize,
        guard_bytes: usize,
    ) -> Result<MemoryPlan> {
        let alignment = alignment.max(1);
        if !alignment.is_power_of_two() {
            return Err(Error::BadValue {
                what: "pool alignment".into(),
                value: alignment.to_string(),
                expected: "a power of two".into(),
            });
        }
        let mut order: Vec<&PlanItem> = items.iter().collect();
        order.sort_by(|a, b| b.size.cmp(&a.size).then(a.node.id().cmp(&b.node.id())));
        let guard = align_up(guard_bytes, alignment);
        let mut plan = MemoryPlan {
            alignment,
            pool_sizes: vec![],
            slots: vec![],
            guard_bytes: guard,
        };
        for item in order {
            // An array's footprint: its aligned size and the guard after it (with the guard
            // before it, what a pool of its own needs).
            let size = item
                .size
                .max(1)
                .checked_next_multiple_of(alignment)
                .and_then(|s| s.checked_add(guard))
                .filter(|s| s.checked_add(guard).is_some())
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "{} needs {} bytes, more than any device can address with its guards                          ({guard} bytes) and alignment ({alignment} bytes)",
                        item.node.debug_name(),
                        item.size
                    ))
                })?;
            let mut placed = None;
            for pool in 0..=plan.pool_sizes.len() {
                // A pool holds up to `max_pool_bytes`, or its first array where that is larger;
                // a fresh pool holds any array.
                let capacity = plan
                    .pool_sizes
                    .get(pool)
                    .map_or(usize::MAX, |&bytes| bytes.max(max_pool_bytes));
                let mut busy: Vec<(usize, usize)> = plan
                    .slots
                    .iter()
                    .filter(|s| s.pool == pool && overlaps(s.lifetime, item.lifetime))
                    .map(|s| {
                        (
                            s.offset,
                            s.offset + align_up(s.size.max(1), alignment) + guard,
                        )
                    })
                    .collect();
                busy.sort();
                let mut offset = guard;
                for (start, end) in busy {
                    if offset.saturating_add(size) <= start {
                        break;
                    }
                    offset = offset.max(end);
                }
                if offset.saturating_add(size) <= capacity {
                    placed = Some((pool, offset));
                    break;
                }
            }
            let (pool, offset) = placed.expect("a fresh pool holds any array");
            if pool == plan.pool_sizes.len() {
                plan.pool_sizes.push(0);
            }
            plan.pool_sizes[pool] = plan.pool_sizes[pool].max(offset + size);
            plan.slots.push(Slot {
                node: item.node.clone(),
                pool,
                offset,
                size: item.size,
                lifetime: item.lifetime,
            });
        }
        Ok(plan)
    }

    /// Total bytes of all pools.
    pub fn total_bytes(&self) -> usize {
        self.pool_sizes.iter().sum()
    }

    /// What bump allocation (no reuse) of the same arrays would need.
    pub fn bump_bytes(&self) -> usize {
        self.slots
            .iter()
            .map(|s| align_up(s.size.max(1), self.alignment))
            .sum()
    }

    /// The byte ranges `(offset, length)` of pool `pool` that no array ever uses: the guards
    /// and the alignment padding. Accesses there are out of every array's bounds.
    pub fn unused_ranges(&self, pool: usize) -> Vec<(usize, usize)> {
        let Some(&pool_size) = self.pool_sizes.get(pool) else {
            return vec![];
        };
        let mut used: Vec<(usize, usize)> = self
            .slots
            .iter()
            .filter(|s| s.pool == pool)
            .map(|s| (s.offset, s.offset + s.size))
            .collect();
        used.sort();
        let mut out = Vec::new();
        let mut at = 0;
        for (start, end) in used {
            if start > at {
                out.push((at, start - at));
            }
            at = at.max(end);
        }
        if pool_size > at {
            out.push((at, pool_size - at));
        }
        out
    }

    /// The slot of a node.
    pub fn slot(&self, node: &Tnode) -> Option<&Slot> {
        self.slots.iter().find(|s| &s.node == node)
    }
}

impl fmt::Display for MemoryPlan {
    /// One line per pool, then one per array: pool, offset, size, lifetime, node.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} pool(s), {} bytes (bump allocation: {} bytes), alignment {}",
            self.pool_sizes.len(),
            self.total_bytes(),
            self.bump_bytes(),
            self.alignment
        )?;
        let mut slots: Vec<&Slot> = self.slots.iter().collect();
        slots.sort_by_key(|s| (s.pool, s.offset, s.node.id()));
        for s in slots {
            let life = match s.lifetime {
                Some((a, b)) => format!("statements {a}..={b}"),
                None => "whole pool".into(),
            };
            writeln!(
                f,
                "  pool {} @ {:>8}: {:>8} bytes, {life}: {}",
                s.pool,
                s.offset,
                s.size,
                s.node.label().join(".")
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrayjit_ir::prec::Prec;

    fn item(bytes: usize, lifetime: Option<(usize, usize)>) -> PlanItem {
        PlanItem {
            node: Tnode::new(Prec::U8, &[bytes], &["n"]).unwrap(),
            size: bytes,
            lifetime,
        }
    }

    #[test]
    fn guards_separate_arrays_and_are_reported_unused() {
        let items = [item(10, None), item(100, None), item(64, None)];
        let plan = MemoryPlan::pack_guarded(&items, 16, 1 << 20, 20).unwrap();
        assert_eq!(plan.guard_bytes, 32);
        let mut spans: Vec<(usize, usize)> = plan
            .slots
            .iter()
            .map(|s| (s.offset, s.offset + s.size))
            .collect();
        spans.sort();
        assert!(spans[0].0 >= 32);
        for w in spans.windows(2) {
            assert!(w[1].0 >= w[0].1 + 32, "{spans:?}");
        }
        assert!(plan.pool_sizes[0] >= spans[2].1 + 32);
        // Used and unused bytes tile the pool exactly.
        let unused: usize = plan.unused_ranges(0).iter().map(|r| r.1).sum();
        assert_eq!(unused + 10 + 100 + 64, plan.pool_sizes[0]);
        for (start, len) in plan.unused_ranges(0) {
            assert!(spans.iter().all(|&(a, b)| start + len <= a || b <= start));
        }
        // Without guards nothing but alignment padding is unused.
        let tight = MemoryPlan::pack(&items, 16, 1 << 20).unwrap();
        let padding: usize = tight.unused_ranges(0).iter().map(|r| r.1).sum();
        assert_eq!(padding, tight.pool_sizes[0] - 174);
        assert!(tight.pool_sizes[0] < plan.pool_sizes[0]);
        assert!(plan.unused_ranges(7).is_empty());
    }

    #[test]
    fn an_array_larger_than_the_pool_limit_gets_a_pool_of_its_own() {
        // The limit groups the small arrays; the large one is never refused.
        let items = [
            item(3000, None),
            item(400, None),
            item(400, None),
            item(300, None),
        ];
        let plan = MemoryPlan::pack_guarded(&items, 16, 1024, 16).unwrap();
        let big = &plan.slots[0];
        assert_eq!((big.size, big.offset), (3000, 16));
        assert_eq!(plan.pool_sizes[big.pool], 16 + 3008 + 16);
        assert!(plan.slots[1..].iter().all(|s| s.pool != big.pool));
        // The two 400s share a pool (16 + 2 * 416 <= 1024), the 300 needs another.
        assert_eq!(plan.pool_sizes.len(), 3);
        assert!(
            plan.pool_sizes
                .iter()
                .enumerate()
                .all(|(p, &b)| p == big.pool || b <= 1024)
        );
        // Where lifetimes allow, later arrays reuse the large pool like any other.
        let scratch = [
            item(5000, Some((0, 0))),
            item(2000, Some((1, 1))),
            item(900, Some((1, 1))),
        ];
        let plan = MemoryPlan::pack(&scratch, 16, 1024).unwrap();
        assert_eq!(plan.pool_sizes, vec![5008]);
        assert_eq!(plan.total_bytes(), 5008);
        // A size no address space holds is an error, not an overflow.
        let err = MemoryPlan::pack_guarded(&[item(1, None)], 16, 1024, usize::MAX / 2 + 1);
        assert!(err.is_err());
    }

    #[test]
    fn disjoint_lifetimes_share_memory() {
        let items = vec![
            item(100, Some((0, 1))),
            item(100, Some((2, 3))),
            item(50, Some((1, 2))),
        ];
        let plan = MemoryPlan::pack(&items, 64, 1 << 20).unwrap();
        assert_eq!(plan.bump_bytes(), 128 + 128 + 64);
        // The two 100-byte arrays share offset 0; the 50-byte one overlaps both in time.
        assert_eq!(plan.total_bytes(), 128 + 64);
        assert_eq!(plan.slot(&items[0].node).unwrap().offset, 0);
        assert_eq!(plan.slot(&items[1].node).unwrap().offset, 0);
        assert_eq!(plan.slot(&items[2].node).unwrap().offset, 128);
    }

    #[test]
    fn offsets_are_aligned_and_whole_lifetimes_never_share() {
        let items = vec![item(3, None), item(5, None), item(70, None)];
        let plan = MemoryPlan::pack(&items, 16, 1 << 20).unwrap();
        assert!(plan.slots.iter().all(|s| s.offset % 16 == 0));
        assert_eq!(plan.total_bytes(), 80 + 16 + 16);
        let mut ranges: Vec<(usize, usize)> = plan
            .slots
            .iter()
            .map(|s| (s.offset, s.offset + s.size))
            .collect();
        ranges.sort();
        assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0));
    }

    #[test]
    fn pools_split_at_the_limit_and_bad_alignments_are_errors() {
        let items = vec![item(60, None), item(60, None), item(60, None)];
        let plan = MemoryPlan::pack(&items, 4, 128).unwrap();
        assert_eq!(plan.pool_sizes, vec![120, 60]);
        // Larger than the limit: a pool of its own, not an error.
        let plan = MemoryPlan::pack(&[item(200, None)], 4, 128).unwrap();
        assert_eq!(plan.pool_sizes, vec![200]);
        assert!(MemoryPlan::pack(&items, 3, 128).is_err());
    }

    #[test]
    fn packing_is_deterministic_and_printable() {
        let items = vec![
            item(10, Some((0, 0))),
            item(20, Some((1, 1))),
            item(30, None),
        ];
        let a = MemoryPlan::pack(&items, 8, 1 << 20).unwrap();
        let b = MemoryPlan::pack(&items, 8, 1 << 20).unwrap();
        assert_eq!(a, b);
        let text = a.to_string();
        assert!(
            text.contains("bump allocation") && text.contains("whole pool"),
            "{text}"
        );
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use arrayjit_ir::prec::Prec;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// Arrays whose lifetimes overlap never overlap in memory; every array fits its pool;
        /// offsets are aligned; planning never needs more than bump allocation.
        #[test]
        fn packing_is_sound(
            specs in proptest::collection::vec((1usize..300, proptest::option::of((0usize..10, 0usize..5))), 1..20),
            align_pow in 0u32..7,
            limit in 300usize..2000,
        ) {
            let items: Vec<PlanItem> = specs
                .iter()
                .map(|&(size, life)| PlanItem {
                    node: Tnode::new(Prec::U8, &[size], &["p"]).unwrap(),
                    size,
                    lifetime: life.map(|(start, len)| (start, start + len)),
                })
                .collect();
            let alignment = 1usize << align_pow;
            let plan = MemoryPlan::pack(&items, alignment, limit.max(align_up(300, alignment))).unwrap();
            prop_assert_eq!(plan.slots.len(), items.len());
            prop_assert!(plan.total_bytes() <= plan.bump_bytes());
            for s in &plan.slots {
                prop_assert_eq!(s.offset % alignment, 0);
                prop_assert!(s.offset + s.size <= plan.pool_sizes[s.pool]);
            }
            for (i, a) in plan.slots.iter().enumerate() {
                for b in &plan.slots[i + 1..] {
                    if a.pool == b.pool && overlaps(a.lifetime, b.lifetime) {
                        prop_assert!(a.offset + a.size <= b.offset || b.offset + b.size <= a.offset,
                            "{:?} and {:?} collide", a, b);
                    }
                }
            }
        }
    }
}
