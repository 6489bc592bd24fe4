//! Nodes whose precision is decided after they are made (the reference's `delayed_prec`,
//! `update_prec`), and nodes made over host arrays that already exist (`create_from_padded`,
//! `create_with_reshape`): the array is moved into the node, never copied.

use super::{Tnode, check_dims, lock};
use crate::error::{Error, Result};
use crate::memory::MemoryMode;
use crate::memory::MemoryType;
use crate::ndarray::{Ndarray, Padding};
use crate::prec::Prec;

/// How a node's precision is decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DelayedPrec {
    /// Fixed when the node is made.
    Specified(Prec),
    /// This precision, unless [`Tnode::update_prec`] asks for another before the precision is
    /// first used (read by [`Tnode::prec`]: sizing, lowering, host values, rendering).
    Default(Prec),
}

impl std::fmt::Display for DelayedPrec {
    /// `f32` for a specified precision, `default f32` for a default one: the form
    /// [`DelayedPrec::from_str`](std::str::FromStr) reads back.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DelayedPrec::Specified(p) => write!(f, "{p}"),
            DelayedPrec::Default(p) => write!(f, "default {p}"),
        }
    }
}

impl std::str::FromStr for DelayedPrec {
    type Err = Error;

    /// Reads what `Display` prints (`f32`, `default f32`; any case, any spacing); anything else
    /// is an [`Error::InvalidArgument`] listing the forms and precisions.
    fn from_str(text: &str) -> Result<DelayedPrec> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let (default, name) = match words.as_slice() {
            [name] => (false, *name),
            [d, name] if d.eq_ignore_ascii_case("default") => (true, *name),
            _ => {
                return Err(Error::BadValue {
                    what: "delayed precision".into(),
                    value: text.into(),
                    expected: "a precision (\"f32\") or \"default\" and one (\"default f32\")"
                        .into(),
                });
            }
        };
        let p = Prec::parse(name).map_err(|e| Error::BadValue {
            what: "delayed precision".into(),
            value: text.into(),
            expected: e.to_string(),
        })?;
        Ok(if default {
            DelayedPrec::Default(p)
        } else {
            DelayedPrec::Specified(p)
        })
    }
}

impl Tnode {
    /// A node whose precision is `default` unless [`Tnode::update_prec`] asks for another
    /// before it is first used: a front end can make nodes before it knows the precision a
    /// whole model will compute in.
    pub fn new_delayed_prec(default: Prec, dims: &[usize], label: &[&str]) -> Result<Tnode> {
        Tnode::build_with(DelayedPrec::Default(default), dims, None, label, None)
    }

    /// Whether the precision is fixed (made with one, or already used).
    pub fn prec_is_fixed(&self) -> bool {
        self.0.prec.get().is_some()
    }

    /// Asks for precision `prec` (`provenance`: who asks, and why). Before the precision is
    /// first used, the latest request wins; once it is fixed, asking for the same precision is
    /// fine and another one is an [`Error::PrecisionFixed`] naming both. A request the node's
    /// size cannot take (more bytes than memory holds) is an error and changes nothing.
    pub fn update_prec(&self, prec: Prec, provenance: impl Into<String>) -> Result<()> {
        let provenance = provenance.into();
        let mut pending = lock(&self.0.delayed_prec);
        if let Some(&fixed) = self.0.prec.get() {
            if fixed == prec {
                return Ok(());
            }
            return Err(Error::PrecisionFixed {
                node: self.debug_name(),
                fixed: fixed.name().into(),
                fixed_provenance: pending.1.clone(),
                requested: prec.name().into(),
                requested_provenance: provenance,
            });
        }
        let fits = self
            .num_elems()
            .checked_mul(prec.size_in_bytes())
            .is_some_and(|b| b <= isize::MAX as usize);
        if !fits {
            return Err(Error::OutOfMemory {
                what: format!("the values of {} in {prec}", self.debug_name()),
                bytes: usize::MAX,
            });
        }
        *pending = (prec, provenance);
        Ok(())
    }

    /// A node over an existing host array, moved in (not copied). With `padding`, the array's
    /// storage holds those margins around the node's logical dims (which are the storage dims
    /// less the margins; the margins should hold the pad value); without, the array's own
    /// padding (if any) is the node's. The node is hosted, in the array's precision.
    pub fn from_padded_host_array(
        ndarray: Ndarray,
        padding: Option<Padding>,
        label: &[&str],
    ) -> Result<Tnode> {
        let ndarray = match padding {
            Some(p) => ndarray.with_padding(p)?,
            None => ndarray,
        };
        let dims = ndarray.logical_dims();
        let padding = ndarray.padding().cloned();
        let prec = ndarray.prec();
        let tn = Tnode::build_with(
            DelayedPrec::Specified(prec),
            &dims,
            padding,
            label,
            Some(ndarray),
        )?;
        tn.update_memory_mode(
            MemoryMode::Hosted(MemoryType::Unset),
            "user: made over an existing host array",
        )?;
        Ok(tn)
    }

    /// A node of logical `dims` over an existing unpadded host array `base`, moved in (not
    /// copied) and read in row-major order: `base` must hold exactly as many elements. With
    /// `padding`, `base` holds the padded layout (its element count is that of the padded
    /// dims). The node is hosted, in `base`'s precision.
    pub fn from_reshaped_host_array(
        base: Ndarray,
        dims: &[usize],
        padding: Option<Padding>,
        label: &[&str],
    ) -> Result<Tnode> {
        let storage_dims = match &padding {
            Some(p) => p.padded_dims(dims)?,
            None => dims.to_vec(),
        };
        check_dims(label, dims)?;
        let nd = base.reshaped(&storage_dims)?;
        Tnode::from_padded_host_array(nd, padding, label)
    }

    /// A node of logical `dims` whose values are an unpadded host array `base` read in
    /// row-major order (as many elements as `dims` hold), stored with `padding` around them
    /// (the reference's `create_with_reshape ~from_padded:false`): the values are copied into
    /// padded storage whose margins hold the pad value. The node is hosted, in `base`'s
    /// precision, bit for bit.
    pub fn from_reshaped_unpadded_host_array(
        base: Ndarray,
        dims: &[usize],
        padding: Padding,
        label: &[&str],
    ) -> Result<Tnode> {
        check_dims(label, dims)?;
        let nd = base.reshaped(dims)?.into_padded(padding)?;
        Tnode::from_padded_host_array(nd, None, label)
    }
}
