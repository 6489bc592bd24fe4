//! Questions about a node's memory mode that the reference asks by name (`known_*`,
//! `potentially_cross_stream`, the `*_force` forms that settle an undecided mode first) and the
//! update of its cross-stream sharing alone (`update_sharing`), all reached through
//! [`Tnode::modes`]. The mode itself, and the one update every decision goes through, stay
//! the node's ([`Tnode::memory_mode`], [`Tnode::update_memory_mode`]).

use super::Tnode;
use crate::error::Result;
use crate::memory::{MemoryMode, MemoryType, Sharing};

/// Every concrete mode in which one device array of the node serves all the device's streams.
const SHARED_MODES: [MemoryMode; 3] = [
    MemoryMode::OnDevice(Sharing::SharedCrossStreams),
    MemoryMode::Hosted(MemoryType::ChangedOnDevices(Sharing::SharedCrossStreams)),
    MemoryMode::Hosted(MemoryType::Constant),
];

/// A node's memory mode, asked about and settled by the reference's named questions
/// ([`Tnode::modes`]). The answers read the mode at the time of the call.
#[derive(Clone, Copy)]
pub struct Modes<'a> {
    node: &'a Tnode,
}

impl Tnode {
    /// The questions about the node's memory mode (see [`Modes`]).
    pub fn modes(&self) -> Modes<'_> {
        Modes { node: self }
    }
}

impl Modes<'_> {
    /// Whether the node is decided to be virtual.
    pub fn known_virtual(&self) -> bool {
        self.mode_is(|m| m == MemoryMode::Virtual)
    }

    /// Whether the node is decided never to be virtual.
    pub fn known_non_virtual(&self) -> bool {
        self.mode_is(|m| !MemoryMode::Virtual.covers(m) && !m.covers(MemoryMode::Virtual))
    }

    /// Whether the node's mode says it has a host array.
    pub fn is_hosted(&self) -> bool {
        self.mode_is(MemoryMode::is_hosted)
    }

    /// Whether the node is decided to be kernel-local.
    pub fn is_local(&self) -> bool {
        self.mode_is(|m| m == MemoryMode::Local)
    }

    /// Whether the node is persisted in contexts (on devices).
    pub fn is_materialized(&self) -> bool {
        self.mode_is(MemoryMode::is_materialized)
    }

    /// Whether the node's mode is undecided.
    pub fn is_unspecified(&self) -> bool {
        self.node.memory_mode().is_none()
    }

    fn mode_is(&self, pred: impl Fn(MemoryMode) -> bool) -> bool {
        self.node.memory_mode().is_some_and(|m| pred(m.mode))
    }

    fn decided_mode(&self) -> Option<MemoryMode> {
        self.node.memory_mode().map(|m| m.mode)
    }

    /// Whether the node is decided to have no array that persists across runs (virtual or
    /// local).
    pub fn known_not_materialized(&self) -> bool {
        matches!(
            self.decided_mode(),
            Some(MemoryMode::Virtual | MemoryMode::Local)
        )
    }

    /// Whether the node is decided not to change after its initialization (effectively
    /// constant, or hosted constant).
    pub fn known_constant(&self) -> bool {
        matches!(
            self.decided_mode(),
            Some(MemoryMode::EffectivelyConstant | MemoryMode::Hosted(MemoryType::Constant))
        )
    }

    /// Whether the node is decided to change only on the host (hosted volatile).
    pub fn known_volatile(&self) -> bool {
        self.decided_mode() == Some(MemoryMode::Hosted(MemoryType::Volatile))
    }

    /// Whether the node may still end up with one array shared by the streams of a device:
    /// its mode is undecided, or covers a shared mode (on device or changed on devices with
    /// sharing shared or unset, hosted constant).
    pub fn potentially_cross_stream(&self) -> bool {
        match self.decided_mode() {
            None => true,
            Some(m) => SHARED_MODES.iter().any(|&s| m.covers(s)),
        }
    }

    /// Whether the node is decided never to be shared across streams (the opposite of
    /// [`Modes::potentially_cross_stream`]).
    pub fn known_non_cross_stream(&self) -> bool {
        !self.potentially_cross_stream()
    }

    /// Settles an undecided or abstract mode to the most local one it allows (undecided:
    /// virtual; see [`MemoryMode::most_local`]), keeping sharing unset, with `provenance`.
    pub fn default_to_most_local(&self, provenance: &str) -> Result<()> {
        match self.node.memory_mode() {
            None => self
                .node
                .update_memory_mode(MemoryMode::Virtual, provenance),
            Some(m) if m.mode.most_local() != m.mode => self.node.update_memory_mode(
                m.mode.most_local(),
                format!("{}; {provenance}", m.provenance),
            ),
            Some(_) => Ok(()),
        }
    }

    /// Whether the node is virtual, settling its mode to the most local one first.
    pub fn is_virtual_force(&self, provenance: &str) -> Result<bool> {
        self.default_to_most_local(provenance)?;
        Ok(self.known_virtual())
    }

    /// Whether the node is hosted, settling its mode to the most local one first.
    pub fn is_hosted_force(&self, provenance: &str) -> Result<bool> {
        self.default_to_most_local(provenance)?;
        Ok(self.is_hosted())
    }

    /// Whether the node is materialized (persisted on devices), settling its mode to the most
    /// local one first.
    pub fn is_materialized_force(&self, provenance: &str) -> Result<bool> {
        self.default_to_most_local(provenance)?;
        Ok(self.is_materialized())
    }

    /// Sets whether the node's device arrays are shared across streams, keeping the rest of its
    /// mode (as the reference's `update_memory_sharing`): `OnDevice(_)` and
    /// `Hosted(ChangedOnDevices(_))` take `sharing`; `Hosted(Nonconstant)` (or plain `Hosted`)
    /// becomes `Hosted(ChangedOnDevices(sharing))`; a mode that does not say yet where the node
    /// lives (undecided, never virtual, device only, materialized) becomes
    /// `OnDevice(sharing)`. A hosted constant or volatile node keeps its mode: devices never
    /// write it, so its arrays are the same values whichever streams hold them. A mode with no
    /// device arrays (virtual, local), or another sharing already decided, is an
    /// [`crate::error::Error::MemoryModeConflict`] naming both requests.
    pub fn update_sharing(&self, sharing: Sharing, provenance: &str) -> Result<()> {
        use MemoryMode::*;
        let target = match self.decided_mode() {
            Some(Hosted(MemoryType::Constant | MemoryType::Volatile)) => return Ok(()),
            Some(Hosted(MemoryType::Unset | MemoryType::Nonconstant))
            | Some(Hosted(MemoryType::ChangedOnDevices(_))) => {
                Hosted(MemoryType::ChangedOnDevices(sharing))
            }
            _ => OnDevice(sharing),
        };
        self.node.update_memory_mode(target, provenance)
    }
}
