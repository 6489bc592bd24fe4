//! Settings read from the environment, each with a documented range. A value outside its range,
//! or one that does not parse, is an [`Error::InvalidSetting`] naming the variable, the value
//! and what is accepted; it is never replaced by a default behind the user's back. An unset or
//! empty variable means the default.

use std::ffi::OsString;
use std::ops::RangeInclusive;

use arrayjit_ir::{Error, Result};

/// Where settings come from: the process environment, or a map in tests.
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// The process environment.
pub fn process_env(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

/// The variable's text if it is set and not blank; a value that is not UTF-8 is an error.
pub fn text(lookup: Lookup<'_>, name: &str) -> Result<Option<String>> {
    match lookup(name) {
        None => Ok(None),
        Some(raw) => match raw.into_string() {
            Ok(s) if s.trim().is_empty() => Ok(None),
            Ok(s) => Ok(Some(s)),
            Err(raw) => Err(Error::InvalidSetting {
                setting: name.to_string(),
                value: raw.to_string_lossy().into_owned(),
                expected: "text in UTF-8".into(),
            }),
        },
    }
}

/// An integer setting in `range` (inclusive), or `default` when unset.
pub fn integer(
    lookup: Lookup<'_>,
    name: &str,
    range: RangeInclusive<u64>,
    default: u64,
) -> Result<u64> {
    let Some(value) = text(lookup, name)? else {
        return Ok(default);
    };
    match value.trim().parse::<u64>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(Error::InvalidSetting {
            setting: name.to_string(),
            value,
            expected: format!(
                "a whole number from {} to {} (default {default})",
                range.start(),
                range.end()
            ),
        }),
    }
}

/// A yes/no setting: `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off` (any case); `default`
/// when unset.
pub fn flag(lookup: Lookup<'_>, name: &str, default: bool) -> Result<bool> {
    let Some(value) = text(lookup, name)? else {
        return Ok(default);
    };
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(Error::InvalidSetting {
            setting: name.to_string(),
            value,
            expected: format!(
                "1, true, yes or on; or 0, false, no or off (default {})",
                if default { "on" } else { "off" }
            ),
        }),
    }
}

/// Checks a configuration field given in code against its documented range.
pub fn check_range(setting: &str, value: u64, range: RangeInclusive<u64>) -> Result<()> {
    if range.contains(&value) {
        return Ok(());
    }
    Err(Error::InvalidSetting {
        setting: setting.to_string(),
        value: value.to_string(),
        expected: format!("a number from {} to {}", range.start(), range.end()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(name: &'static str, value: &'static str) -> impl Fn(&str) -> Option<OsString> {
        move |n: &str| (n == name).then(|| OsString::from(value))
    }

    #[test]
    fn integers_are_parsed_and_range_checked() {
        let get = |v: &'static str| integer(&one("N", v), "N", 1..=8, 3);
        assert_eq!(get("5").unwrap(), 5);
        assert_eq!(get(" 8 ").unwrap(), 8);
        assert_eq!(get("").unwrap(), 3);
        assert_eq!(integer(&|_: &str| None, "N", 1..=8, 3).unwrap(), 3);
        for bad in ["0", "9", "-1", "abc", "lots", "18446744073709551616", "1.5"] {
            let e = get(bad).unwrap_err().to_string();
            assert!(
                e.contains("setting N") && e.contains(bad) && e.contains("from 1 to 8"),
                "{e}"
            );
        }
    }

    #[test]
    fn flags_accept_the_usual_words_and_nothing_else() {
        let get = |v: &'static str| flag(&one("F", v), "F", false);
        for yes in ["1", "true", "YES", "on"] {
            assert!(get(yes).unwrap());
        }
        for no in ["0", "false", "No", "off"] {
            assert!(!get(no).unwrap());
        }
        assert!(matches!(get("maybe"), Err(Error::InvalidSetting { .. })));
    }

    #[cfg(unix)]
    #[test]
    fn non_utf8_values_are_errors() {
        use std::os::unix::ffi::OsStringExt;
        let lookup = |_: &str| Some(OsString::from_vec(vec![0x66, 0xff]));
        assert!(matches!(
            text(&lookup, "X"),
            Err(Error::InvalidSetting { .. })
        ));
    }
}
