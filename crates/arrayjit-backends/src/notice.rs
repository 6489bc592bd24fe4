//! Warnings a user must see even when the program installed no `tracing` subscriber: an
//! unusable compile cache folder, a stream dropped with an error nobody read. [`warn_user`]
//! sends them through `tracing` (target `arrayjit`) when a subscriber is installed, else
//! prints them on stderr; each distinct message once per process, so a warning about a folder
//! does not repeat at every compile.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

/// Warns the user once per distinct `message` (see the module documentation). Returns whether
/// the message was new.
pub fn warn_user(message: &str) -> bool {
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let new = SEEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(message.to_string());
    if new {
        if tracing::dispatcher::has_been_set() {
            tracing::warn!(target: "arrayjit", "{message}");
        } else {
            eprintln!("arrayjit warning: {message}");
        }
    }
    new
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_message_once() {
        assert!(super::warn_user("test: a warning seen once"));
        assert!(!super::warn_user("test: a warning seen once"));
    }
}
