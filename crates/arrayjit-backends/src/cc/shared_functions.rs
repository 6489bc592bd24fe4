//! Statement functions shared between the C libraries of this process
//! ([`arrayjit_codegen::SharedFunctions`]): which loaded libraries define which functions, the
//! functions a new library imports instead of compiling them again, and binding its pointers
//! once it is loaded. The forward pass that a model's training step and its held-out loss
//! share renders to the same functions; the routine compiled first defines them and the later
//! one calls its copy.
//!
//! Rules:
//! - A function is imported only from a live library of the same compiler and flags whose
//!   function of that name has the same text (names are hashes of the text; the text decides).
//! - A library that imports keeps the libraries it imports from loaded as long as it lives.
//! - A library runs only after every imported pointer was set; when one cannot be found, the
//!   routines are compiled again with every function defined.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use arrayjit_codegen::{BIND_SYMBOL, FIND_SYMBOL};
use arrayjit_ir::Result;

use super::library::LoadedLibrary;
use super::stats::IMPORTED;

/// `aj_statement_function`: the address of a function the library defines, or null.
type FindFn = unsafe extern "C" fn(*const c_char) -> *mut c_void;
/// What `aj_bind_statement_functions` calls for each imported function.
type LookupFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
/// `aj_bind_statement_functions`: sets the pointers; returns how many were not found.
type BindFn = unsafe extern "C" fn(LookupFn, *mut c_void) -> i64;

/// Statement functions' texts by name.
type Texts = Arc<HashMap<String, String>>;

/// A loaded library that defines statement functions.
struct Provider {
    /// The compiler and flags it was built with.
    flavor: String,
    library: Weak<LoadedLibrary>,
    /// Its lookup (valid while the library is loaded).
    find: FindFn,
    /// Its functions' texts by name.
    functions: Texts,
}

static PROVIDERS: Mutex<Vec<Provider>> = Mutex::new(Vec::new());

/// Records that `library` (built with `flavor`) defines `defined` (name, text), so that
/// libraries rendered later may import them. A library without the lookup entry point (built
/// before libraries exported one) is not recorded.
pub(super) fn register(flavor: &str, library: &Arc<LoadedLibrary>, defined: &[(String, String)]) {
    if defined.is_empty() {
        return;
    }
    // SAFETY: the generated lookup has this signature (`SharedFunctions::exports`).
    let Ok(find) = (unsafe { library.entry::<FindFn>(FIND_SYMBOL) }) else {
        return;
    };
    let functions = Arc::new(defined.iter().cloned().collect());
    let mut providers = PROVIDERS.lock().unwrap_or_else(PoisonError::into_inner);
    providers.retain(|p| p.library.strong_count() > 0);
    providers.push(Provider {
        flavor: flavor.to_string(),
        library: Arc::downgrade(library),
        find,
        functions,
    });
}

/// The functions a library being rendered may import: those of the live libraries of one
/// flavor, and which library each chosen one comes from.
pub(super) struct Imports {
    providers: Vec<(Arc<LoadedLibrary>, FindFn, Texts)>,
    chosen: Mutex<HashMap<String, usize>>,
}

impl Imports {
    /// Nothing to import.
    pub(super) fn none() -> Imports {
        Imports {
            providers: Vec::new(),
            chosen: Mutex::new(HashMap::new()),
        }
    }

    /// What the live libraries built with `flavor` offer (held alive while this lives).
    pub(super) fn live(flavor: &str) -> Imports {
        let mut providers = PROVIDERS.lock().unwrap_or_else(PoisonError::into_inner);
        providers.retain(|p| p.library.strong_count() > 0);
        let live = providers
            .iter()
            .filter(|p| p.flavor == flavor)
            .filter_map(|p| Some((p.library.upgrade()?, p.find, p.functions.clone())))
            .collect();
        Imports {
            providers: live,
            chosen: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a live library defines function `name` with exactly this text; if so, the
    /// function is imported from it.
    pub(super) fn offer(&self, name: &str, text: &str) -> bool {
        let Some(at) = self
            .providers
            .iter()
            .position(|(_, _, functions)| functions.get(name).is_some_and(|t| t == text))
        else {
            return false;
        };
        self.chosen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_string(), at);
        true
    }

    /// Sets the pointers of `library`'s `imported` functions from the libraries they were
    /// chosen from. Returns those libraries (to be kept loaded as long as `library` is), or
    /// `None` when some function could not be found (then `library` must not run).
    ///
    /// # Safety
    /// `library` was rendered with these imports (its binder takes them by name).
    pub(super) unsafe fn bind(
        &self,
        library: &LoadedLibrary,
        imported: &[String],
    ) -> Result<Option<Vec<Arc<LoadedLibrary>>>> {
        if imported.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let chosen = self.chosen.lock().unwrap_or_else(PoisonError::into_inner);
        let mut finders: HashMap<String, FindFn> = HashMap::new();
        let mut used = vec![false; self.providers.len()];
        for name in imported {
            let Some(&at) = chosen.get(name) else {
                return Ok(None);
            };
            finders.insert(name.clone(), self.providers[at].1);
            used[at] = true;
        }
        // SAFETY: the generated binder has this signature (`SharedFunctions::exports`).
        let bind = unsafe { library.entry::<BindFn>(BIND_SYMBOL)? };
        let ctx = (&finders as *const HashMap<String, FindFn>)
            .cast_mut()
            .cast();
        // SAFETY: `lookup` reads `ctx` as the map above, which outlives the call; the found
        // addresses are of functions with the same text, so the same signature, as the
        // pointers they are stored in.
        let missing = unsafe { bind(lookup, ctx) };
        if missing != 0 {
            return Ok(None);
        }
        IMPORTED.fetch_add(imported.len(), Ordering::Relaxed);
        Ok(Some(
            self.providers
                .iter()
                .zip(used)
                .filter(|(_, u)| *u)
                .map(|((library, _, _), _)| library.clone())
                .collect(),
        ))
    }
}

/// The binder's lookup: `ctx` is the name → lookup map of [`Imports::bind`].
unsafe extern "C" fn lookup(ctx: *mut c_void, name: *const c_char) -> *mut c_void {
    if ctx.is_null() || name.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `bind` passes its map as `ctx` and the binder a NUL-terminated literal.
    let (finders, name) = unsafe {
        (
            &*(ctx as *const HashMap<String, FindFn>),
            CStr::from_ptr(name),
        )
    };
    match name.to_str().ok().and_then(|n| finders.get(n)) {
        // SAFETY: the provider's generated lookup, with the NUL-terminated name.
        Some(find) => unsafe { find(name.as_ptr()) },
        None => std::ptr::null_mut(),
    }
}
