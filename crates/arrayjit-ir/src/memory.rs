//! Memory modes of tensor nodes: where a node lives (inlined, kernel-local, on devices, on the
//! host), the refinement order between the modes, and the provenance that says why a mode was
//! chosen.

use std::fmt;

/// Whether a node's device copy may be shared across the streams of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sharing {
    /// Not decided yet.
    Unset,
    /// Each stream has its own copy.
    PerStream,
    /// All streams of a device share one copy (read-only from all but one stream).
    SharedCrossStreams,
}

/// How a hosted node changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryType {
    /// Not decided yet: any of the others.
    Unset,
    /// Does not change after initialization.
    Constant,
    /// Changes: one of [`MemoryType::ChangedOnDevices`] or [`MemoryType::Volatile`].
    Nonconstant,
    /// Changes only on devices; the host sees it after a `to_host`.
    ChangedOnDevices(Sharing),
    /// Changes only on the host; devices see it after a `from_host` (possibly followed by
    /// device-to-device copies).
    Volatile,
}

/// Where a tensor node lives, from the most abstract request to the concrete placement.
///
/// Abstract modes ([`MemoryMode::EffectivelyConstant`], [`MemoryMode::NeverVirtual`],
/// [`MemoryMode::DeviceOnly`], [`MemoryMode::Materialized`], `Hosted(Unset | Nonconstant)`) are
/// refined by later requests and by the optimizer; see [`MemoryMode::covers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryMode {
    /// Either `Hosted(Constant)` or computed inline (`Virtual` or `Local`).
    EffectivelyConstant,
    /// Computations are inlined into their uses, one scalar at a time; no array exists.
    Virtual,
    /// One of `Local`, `OnDevice`, `Hosted`.
    NeverVirtual,
    /// The whole node is kept for the duration of one routine run (on the stack of the kernel),
    /// not persisted across runs.
    Local,
    /// One of `Local`, `OnDevice`.
    DeviceOnly,
    /// Stored on the devices that compute with it and persisted across runs; not on the host.
    OnDevice(Sharing),
    /// One of `OnDevice`, `Hosted`.
    Materialized,
    /// Stored on devices and mirrored in a host array.
    Hosted(MemoryType),
}

impl MemoryMode {
    /// The modes one step more specific than `self`.
    fn children(self) -> Vec<MemoryMode> {
        use MemoryMode::*;
        use MemoryType as T;
        use Sharing::*;
        match self {
            EffectivelyConstant => vec![Virtual, Local, Hosted(T::Constant)],
            NeverVirtual => vec![DeviceOnly, Materialized],
            DeviceOnly => vec![Local, OnDevice(Unset)],
            Materialized => vec![OnDevice(Unset), Hosted(T::Unset)],
            OnDevice(Unset) => vec![OnDevice(PerStream), OnDevice(SharedCrossStreams)],
            Hosted(T::Unset) => vec![Hosted(T::Constant), Hosted(T::Nonconstant)],
            Hosted(T::Nonconstant) => vec![Hosted(T::ChangedOnDevices(Unset)), Hosted(T::Volatile)],
            Hosted(T::ChangedOnDevices(Unset)) => vec![
                Hosted(T::ChangedOnDevices(PerStream)),
                Hosted(T::ChangedOnDevices(SharedCrossStreams)),
            ],
            _ => vec![],
        }
    }

    /// Whether `self` is `other` or a more abstract mode that `other` refines.
    pub fn covers(self, other: MemoryMode) -> bool {
        self == other || self.children().into_iter().any(|c| c.covers(other))
    }

    /// Every memory mode, abstract ones included.
    pub fn all() -> Vec<MemoryMode> {
        use MemoryMode::*;
        use MemoryType as T;
        let sharings = [
            Sharing::Unset,
            Sharing::PerStream,
            Sharing::SharedCrossStreams,
        ];
        let mut all = vec![
            EffectivelyConstant,
            Virtual,
            NeverVirtual,
            Local,
            DeviceOnly,
            Materialized,
        ];
        all.extend(sharings.map(OnDevice));
        all.extend([T::Unset, T::Constant, T::Nonconstant, T::Volatile].map(Hosted));
        all.extend(sharings.map(|s| Hosted(T::ChangedOnDevices(s))));
        all
    }

    /// The most abstract mode that refines both, if any: the result of requesting both. When two
    /// incomparable modes refine both (e.g. `EffectivelyConstant` and `NeverVirtual` admit `Local`
    /// and `Hosted(Constant)`), the more local one is chosen.
    pub fn meet(self, other: MemoryMode) -> Option<MemoryMode> {
        let common: Vec<MemoryMode> = MemoryMode::all()
            .into_iter()
            .filter(|&m| self.covers(m) && other.covers(m))
            .collect();
        let maximal: Vec<MemoryMode> = common
            .iter()
            .copied()
            .filter(|&m| !common.iter().any(|&c| c != m && c.covers(m)))
            .collect();
        // `all()` lists local modes before hosted ones, so the first maximal mode is the most local.
        maximal.first().copied()
    }

    /// Whether no array exists for the node (it is inlined).
    pub fn is_virtual(self) -> bool {
        self == MemoryMode::Virtual
    }

    /// Whether the mode says the node has a host array.
    pub fn is_hosted(self) -> bool {
        matches!(self, MemoryMode::Hosted(_))
    }

    /// Whether the node is persisted in a context (on a device) across runs.
    pub fn is_materialized(self) -> bool {
        matches!(self, MemoryMode::Hosted(_) | MemoryMode::OnDevice(_))
    }

    /// The most local concrete mode this mode allows: what an undecided choice defaults to.
    /// Sharing is kept `Unset`.
    pub fn most_local(self) -> MemoryMode {
        use MemoryMode::*;
        match self {
            EffectivelyConstant => Virtual,
            NeverVirtual | DeviceOnly => Local,
            Materialized => OnDevice(Sharing::Unset),
            m => m,
        }
    }
}

impl fmt::Display for Sharing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Sharing::Unset => "unset sharing",
            Sharing::PerStream => "per stream",
            Sharing::SharedCrossStreams => "shared across streams",
        })
    }
}

impl fmt::Display for MemoryMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use MemoryMode::*;
        match self {
            EffectivelyConstant => f.write_str("effectively constant"),
            Virtual => f.write_str("virtual"),
            NeverVirtual => f.write_str("never virtual"),
            Local => f.write_str("local"),
            DeviceOnly => f.write_str("device only"),
            OnDevice(s) => write!(f, "on device ({s})"),
            Materialized => f.write_str("materialized"),
            Hosted(t) => match t {
                MemoryType::Unset => f.write_str("hosted"),
                MemoryType::Constant => f.write_str("hosted constant"),
                MemoryType::Nonconstant => f.write_str("hosted nonconstant"),
                MemoryType::ChangedOnDevices(s) => write!(f, "hosted, changed on devices ({s})"),
                MemoryType::Volatile => f.write_str("hosted volatile"),
            },
        }
    }
}

/// A memory mode and why it was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModeWithProvenance {
    /// The mode.
    pub mode: MemoryMode,
    /// Who asked for it and why, e.g. `"user: set_values on the host"` or
    /// `"optimizer: read 3 times per element (more than virtualize_max_visits = 1)"`.
    pub provenance: String,
}

impl fmt::Display for ModeWithProvenance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (because: {})", self.mode, self.provenance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use MemoryMode::*;

    #[test]
    fn refinement_order() {
        assert!(NeverVirtual.covers(Hosted(MemoryType::Volatile)));
        assert!(Materialized.covers(OnDevice(Sharing::PerStream)));
        assert!(!Materialized.covers(Local));
        assert!(!Virtual.covers(Local));
        assert_eq!(EffectivelyConstant.meet(NeverVirtual), Some(Local));
        assert_eq!(
            EffectivelyConstant.meet(Materialized),
            Some(Hosted(MemoryType::Constant))
        );
        assert_eq!(
            DeviceOnly.meet(Materialized),
            Some(OnDevice(Sharing::Unset))
        );
        assert_eq!(Virtual.meet(NeverVirtual), None);
        assert_eq!(Local.meet(Hosted(MemoryType::Unset)), None);
        assert_eq!(
            Hosted(MemoryType::Nonconstant).meet(Hosted(MemoryType::Constant)),
            None
        );
    }
}
