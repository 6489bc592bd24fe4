//! Memory modes of tensor nodes: where a node lives (inlined, kernel-local, on devices, on the
//! host), the refinement order between the modes, and the provenance that says why a mode was
//! chosen.
//!
//! The three enums order as they are declared (the reference's `compare_*`), and parse from
//! text ([`std::str::FromStr`], the reference's `*_of_sexp`): their `Display` form (`"hosted,
//! changed on devices (per stream)"`), their `Debug` form (`"Hosted(ChangedOnDevices(PerStream))"`)
//! or the reference's constructors (`"Hosted (Changed_on_devices Per_stream)"`), in any case.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// Whether a node's device copy may be shared across the streams of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Sharing {
    /// Not decided yet.
    Unset,
    /// Each stream has its own copy.
    PerStream,
    /// All streams of a device share one copy (read-only from all but one stream).
    SharedCrossStreams,
}

/// How a hosted node changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemoryMode {
    /// Either `Hosted(Constant)` or computed inline (`Virtual`), as the reference says ("either
    /// Hosted Constant, or a subset of Virtual"); so with `NeverVirtual` it meets at
    /// `Hosted(Constant)`.
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
            EffectivelyConstant => vec![Virtual, Hosted(T::Constant)],
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
    /// incomparable modes refine both (e.g. `DeviceOnly` and `Hosted(Unset)` admit none, but
    /// `NeverVirtual` and `Materialized` admit only their common children), the more local one
    /// is chosen.
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

impl fmt::Display for MemoryType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryType::Unset => f.write_str("unset"),
            MemoryType::Constant => f.write_str("constant"),
            MemoryType::Nonconstant => f.write_str("nonconstant"),
            MemoryType::ChangedOnDevices(s) => write!(f, "changed on devices ({s})"),
            MemoryType::Volatile => f.write_str("volatile"),
        }
    }
}

const SHARINGS: [Sharing; 3] = [
    Sharing::Unset,
    Sharing::PerStream,
    Sharing::SharedCrossStreams,
];

impl Sharing {
    /// Every sharing, in order.
    pub fn all() -> [Sharing; 3] {
        SHARINGS
    }
}

impl MemoryType {
    /// Every memory type, in order.
    pub fn all() -> Vec<MemoryType> {
        use MemoryType::*;
        let mut all = vec![Unset, Constant, Nonconstant];
        all.extend(SHARINGS.map(ChangedOnDevices));
        all.push(Volatile);
        all
    }
}

/// Words of a name, for matching: camel case and separators split, lower case, `across` and
/// `cross` alike, the word `sharing` dropped.
fn name_words(text: &str) -> Vec<String> {
    let mut spaced = String::with_capacity(text.len() * 2);
    let mut prev_lower = false;
    for c in text.chars() {
        if c.is_uppercase() && prev_lower {
            spaced.push(' ');
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        spaced.push(if c.is_alphanumeric() { c } else { ' ' });
    }
    spaced
        .to_lowercase()
        .split_whitespace()
        .filter(|w| *w != "sharing")
        .map(|w| if w == "across" { "cross" } else { w }.to_string())
        .collect()
}

/// The value among `all` whose `Display` or `Debug` form names the same words as `text`.
fn parse_named<T: Copy + fmt::Display + fmt::Debug>(
    text: &str,
    all: &[T],
    what: &str,
) -> Result<T, Error> {
    let words = name_words(text);
    all.iter()
        .copied()
        .find(|v| name_words(&v.to_string()) == words || name_words(&format!("{v:?}")) == words)
        .ok_or_else(|| {
            let names: Vec<String> = all.iter().map(|v| format!("{v:?}")).collect();
            Error::BadValue {
                what: what.into(),
                value: text.into(),
                expected: format!(
                    "one of {} (or their displayed forms, e.g. \"{}\")",
                    names.join(", "),
                    all[all.len() - 1]
                ),
            }
        })
}

impl FromStr for Sharing {
    type Err = Error;
    fn from_str(text: &str) -> Result<Sharing, Error> {
        parse_named(text, &SHARINGS, "sharing")
    }
}

impl FromStr for MemoryType {
    type Err = Error;
    fn from_str(text: &str) -> Result<MemoryType, Error> {
        parse_named(text, &MemoryType::all(), "memory type")
    }
}

impl FromStr for MemoryMode {
    type Err = Error;
    fn from_str(text: &str) -> Result<MemoryMode, Error> {
        parse_named(text, &MemoryMode::all(), "memory mode")
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
        // The reference: "Effectively_constant: either Hosted Constant, or a subset of Virtual".
        assert_eq!(
            EffectivelyConstant.meet(NeverVirtual),
            Some(Hosted(MemoryType::Constant))
        );
        assert_eq!(EffectivelyConstant.meet(Local), None);
        assert_eq!(EffectivelyConstant.meet(Virtual), Some(Virtual));
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

    #[test]
    fn every_mode_parses_from_its_display_debug_and_reference_forms() {
        for m in MemoryMode::all() {
            assert_eq!(m.to_string().parse::<MemoryMode>().unwrap(), m, "{m}");
            assert_eq!(format!("{m:?}").parse::<MemoryMode>().unwrap(), m, "{m:?}");
        }
        for t in MemoryType::all() {
            assert_eq!(t.to_string().parse::<MemoryType>().unwrap(), t);
            assert_eq!(format!("{t:?}").parse::<MemoryType>().unwrap(), t);
        }
        for s in Sharing::all() {
            assert_eq!(s.to_string().parse::<Sharing>().unwrap(), s);
        }
        // The reference's constructor spellings (its sexps).
        assert_eq!(
            "Hosted (Changed_on_devices Shared_cross_streams)"
                .parse::<MemoryMode>()
                .unwrap(),
            Hosted(MemoryType::ChangedOnDevices(Sharing::SharedCrossStreams))
        );
        assert_eq!(
            "On_device Per_stream".parse::<MemoryMode>().unwrap(),
            OnDevice(Sharing::PerStream)
        );
        assert_eq!(
            "Effectively_constant".parse::<MemoryMode>().unwrap(),
            EffectivelyConstant
        );
        assert_eq!(
            "Volatile".parse::<MemoryType>().unwrap(),
            MemoryType::Volatile
        );
        let err = "hosted sometimes".parse::<MemoryMode>().unwrap_err();
        assert!(
            matches!(&err, Error::BadValue { what, value, .. }
                if what == "memory mode" && value == "hosted sometimes"),
            "{err}"
        );
        assert!("".parse::<Sharing>().is_err());
    }

    #[test]
    fn modes_compare_in_declaration_order() {
        assert!(EffectivelyConstant < Virtual && Virtual < NeverVirtual);
        assert!(OnDevice(Sharing::Unset) < OnDevice(Sharing::PerStream));
        assert!(OnDevice(Sharing::SharedCrossStreams) < Materialized);
        assert!(Hosted(MemoryType::Constant) < Hosted(MemoryType::Volatile));
        assert!(Sharing::PerStream < Sharing::SharedCrossStreams);
        let mut sorted = MemoryMode::all();
        sorted.sort();
        assert_eq!(sorted.first(), Some(&EffectivelyConstant));
        assert_eq!(sorted.last(), Some(&Hosted(MemoryType::Volatile)));
    }
}
